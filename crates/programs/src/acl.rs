//! `acl`: a stateless 5-tuple access list (permit/deny, first match wins) in front of
//! forwarding or routing.
//!
//! Rules are read top down, as in a router's ACL: the first rule that matches decides;
//! nothing matching gets `default` (deny unless said otherwise). Permitted packets go on to
//! the next stage: a `router` given in `[program.acl.router]` (the `acl` before `router` of
//! a firewall-router), or else `forward`'s port map. Denied packets are dropped (`denied`).
//! IPv4 only; IPv6 and non-IP packets take `default`.
//!
//! State: a ternary table, `rules` in the control API (read-centric: shared by the workers;
//! a change from the control plane builds an updated table on the control plane's thread,
//! which the workers swap in between bursts), and per rule its packet and byte counters
//! (per worker; `rule_packets` and `rule_bytes` by rule id, the last index for packets no
//! rule matched; a rule's packets are also its entry's hits). Configured rules take ids 0,
//! 1, ... and priorities from the top down (the first rule highest); rules the control
//! plane inserts name their own priority and take free ids. A rule can be given a policer
//! (`rule_meters`, srTCM or trTCM, set by the control plane): packets it permits that the
//! meter colours red are dropped (`policed`). Configuration:
//! `rules = [{ action = "permit" | "deny", src = "198.18.0.0/16", dst = "any",
//! proto = "tcp" | "udp" | "icmp" | NUMBER | "any", src_ports = "any" | "80" | "1024-65535",
//! dst_ports = ... }]` or `{ action, match = "tcp,nw_dst=198.19.0.0/16,tp_dst=80" }` (the
//! pipeline's rule text, its IPv4, protocol and port words), `capacity` (rules at most,
//! default 4096), `default`, and `map` or `router`. A `firewall`'s policy is built here
//! too, its rules in two lists by `direction` (inbound ones judge connections opened from
//! outside, with no default); an `acl` refuses `direction`.

use crate::forward::{Forward, ForwardConfig};
use crate::router::{Router, RouterConfig, Tables};
use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, DropReason, PacketDesc, Program, Verdict};
use stateplane_state::control::{Action, Field, Format, MatchKind, page};
use stateplane_state::ternary::{Packet5, Rule, Ternary};
use stateplane_state::{
    Colour, ControlError, Counters, Declaration, Entry, Guarantee, Kind, Match, Meter, PacketBytes,
    Reply, Request, Write,
};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclRule {
    pub action: String,
    #[serde(default = "any")]
    pub src: String,
    #[serde(default = "any")]
    pub dst: String,
    #[serde(default = "any")]
    pub proto: String,
    #[serde(default = "any")]
    pub src_ports: String,
    #[serde(default = "any")]
    pub dst_ports: String,
    /// The match in the pipeline's rule text (`tcp,nw_dst=198.18.0.0/16,tp_dst=80`), in
    /// place of `src`, `dst`, `proto` and the ports.
    #[serde(rename = "match")]
    pub matching: Option<String>,
    /// `firewall`'s rules only: `out` (the default: the rule judges connections the
    /// inside opens) or `in` (connections opened from outside, as pf's `pass in`).
    pub direction: Option<String>,
}

/// What a rule matches: source and destination prefixes, protocol, port ranges.
type Matched = ((u32, u8), (u32, u8), Option<u8>, (u16, u16), (u16, u16));

/// The words of the pipeline's rule text a rule's `match` may use: what the rules match.
const MATCH_WORDS: [&str; 10] = [
    "ip", "tcp", "udp", "icmp", "nw_src", "nw_dst", "nw_proto", "tp_src", "tp_dst", "dl_type",
];

/// A rule's `match` (under `field`), read by the pipeline's rule parser.
fn parse_match(field: &str, text: &str) -> Result<Matched, ConfigError> {
    let refuse = |problem: String| ConfigError::new(field, problem);
    for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let key = word.split_once('=').map_or(word, |(k, _)| k);
        if !MATCH_WORDS.contains(&key) {
            return Err(refuse(format!(
                "'{word}': a rule here matches IPv4 addresses, protocol and ports, in the \
                 pipeline's words ({}); the action is the rule's `action`",
                MATCH_WORDS.join(", ")
            )));
        }
    }
    let rule = stateplane_classifier::rule_text::parse_rule(&format!("{text},actions=drop"))
        .map_err(|e| refuse(e.to_string()))?;
    let (value, mask) = (&rule.pattern.value, &rule.pattern.mask);
    if mask.eth_type != 0 && value.eth_type != 0x0800 {
        return Err(refuse(format!(
            "dl_type=0x{:04x}: the rules match IPv4 only",
            value.eth_type
        )));
    }
    // Addresses are IPv4 mapped into 128 bits: the prefix is the mask's bits past 96.
    let prefix = |value: u128, mask: u128| {
        let len = mask.count_ones().saturating_sub(96) as u8;
        (value as u32, len)
    };
    let proto = (mask.ip_proto != 0).then_some(value.ip_proto);
    Ok((
        prefix(value.ip_src, mask.ip_src),
        prefix(value.ip_dst, mask.ip_dst),
        proto,
        rule.pattern.tp_src,
        rule.pattern.tp_dst,
    ))
}

impl AclRule {
    /// What the rule matches (its fields under `field`), from `match` or from its own
    /// fields, not both.
    fn matched(&self, field: &str) -> Result<Matched, ConfigError> {
        if let Some(text) = &self.matching {
            let own = [
                &self.src,
                &self.dst,
                &self.proto,
                &self.src_ports,
                &self.dst_ports,
            ];
            if own.iter().any(|v| *v != "any") {
                return Err(ConfigError::new(
                    format!("{field}.match"),
                    "give either match or src, dst, proto and the ports, not both",
                ));
            }
            return parse_match(&format!("{field}.match"), text);
        }
        Ok((
            prefix(&format!("{field}.src"), &self.src)?,
            prefix(&format!("{field}.dst"), &self.dst)?,
            proto(&format!("{field}.proto"), &self.proto)?,
            ports(&format!("{field}.src_ports"), &self.src_ports)?,
            ports(&format!("{field}.dst_ports"), &self.dst_ports)?,
        ))
    }
}

fn any() -> String {
    "any".into()
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclConfig {
    #[serde(default)]
    pub rules: Vec<AclRule>,
    /// "permit" or "deny" (the default) for packets no rule matches.
    pub default: Option<String>,
    #[serde(default)]
    pub map: BTreeMap<String, String>,
    pub router: Option<RouterConfig>,
    #[serde(default = "default_capacity")]
    pub capacity: usize,
}

fn default_capacity() -> usize {
    4096
}

/// What a matching rule does, and whose counters count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleAction {
    pub permit: bool,
    pub id: u32,
    /// A `firewall` rule for connections opened from outside.
    pub inbound: bool,
}

/// The actions in the control API: an `acl`'s, then the inbound ones a `firewall`'s
/// rules also take.
const ACTIONS: [&str; 4] = ["permit", "deny", "permit_in", "deny_in"];

impl RuleAction {
    fn name(&self) -> &'static str {
        ACTIONS[usize::from(!self.permit) + 2 * usize::from(self.inbound)]
    }

    /// The rule action `name` (one of [`ACTIONS`], as the control API checked) with `id`.
    fn named(name: &str, id: u32) -> RuleAction {
        RuleAction {
            permit: name.starts_with("permit"),
            id,
            inbound: name.ends_with("_in"),
        }
    }
}

/// The rules and their classifiers, replaced whole by the control plane.
struct Rules {
    list: Vec<Rule<RuleAction>>,
    /// The rules for packets from the inside (an `acl`'s: every rule).
    table: Ternary<RuleAction>,
    /// A `firewall`'s rules for connections opened from outside.
    inbound: Ternary<RuleAction>,
    capacity: usize,
}

/// What a write prepares: the next rules, or the next routes of the router behind them.
pub enum Prepared {
    Rules(RulesUpdate),
    Routes(Arc<Tables>),
}

/// A change the control plane prepared: the new rules, and the ids whose counters start
/// again from zero (rules added or removed).
pub struct RulesUpdate {
    rules: Arc<Rules>,
    reset: Vec<u32>,
}

/// The rules table in the control API; with `directions`, a `firewall`'s, whose actions
/// include the inbound ones.
fn rules_declaration(capacity: usize, directions: bool) -> Declaration {
    let f = Field::new;
    Declaration {
        name: "rules".into(),
        capacity,
        guarantees: vec![Guarantee::Local],
        kind: Kind::Table {
            key: vec![
                f("src", 32, Format::Ipv4, MatchKind::Lpm),
                f("dst", 32, Format::Ipv4, MatchKind::Lpm),
                f("proto", 8, Format::Int, MatchKind::Ternary),
                f("src_port", 16, Format::Int, MatchKind::Range),
                f("dst_port", 16, Format::Int, MatchKind::Range),
            ],
            actions: ACTIONS[..if directions { 4 } else { 2 }]
                .iter()
                .map(|&name| Action {
                    name: name.into(),
                    params: Vec::new(),
                })
                .collect(),
            writable: true,
        },
    }
}

/// A rule from a checked entry's key (its action and id set by the caller).
fn rule_of(key: &[Match], priority: u32, action: RuleAction) -> Rule<RuleAction> {
    let prefix = |i: usize| match key.get(i) {
        Some(Match::Prefix { value, len }) => (*value as u32, *len),
        _ => (0, 0),
    };
    let range = |i: usize| match key.get(i) {
        Some(Match::Range { low, high }) => (*low as u16, *high as u16),
        _ => (0, u16::MAX),
    };
    let proto = match key.get(2) {
        Some(Match::Ternary { value, mask }) if *mask != 0 => Some(*value as u8),
        _ => None,
    };
    let ((src, src_len), (dst, dst_len)) = (prefix(0), prefix(1));
    Rule {
        src,
        src_len,
        dst,
        dst_len,
        proto,
        src_ports: range(3),
        dst_ports: range(4),
        priority,
        action,
    }
}

fn entry_of(r: &Rule<RuleAction>, hits: u64) -> Entry {
    let (proto, proto_mask) = r.proto.map_or((0, 0), |p| (u128::from(p), 0xff));
    Entry {
        key: vec![
            Match::Prefix {
                value: u128::from(r.src),
                len: r.src_len,
            },
            Match::Prefix {
                value: u128::from(r.dst),
                len: r.dst_len,
            },
            Match::Ternary {
                value: proto,
                mask: proto_mask,
            },
            Match::Range {
                low: u128::from(r.src_ports.0),
                high: u128::from(r.src_ports.1),
            },
            Match::Range {
                low: u128::from(r.dst_ports.0),
                high: u128::from(r.dst_ports.1),
            },
        ],
        action: r.action.name().into(),
        params: Vec::new(),
        priority: r.priority,
        hits,
    }
}

/// Whether two rules have the same key and priority (how the control plane names a rule).
fn same_rule(a: &Rule<RuleAction>, b: &Rule<RuleAction>) -> bool {
    (
        a.src,
        a.src_len,
        a.dst,
        a.dst_len,
        a.proto,
        a.src_ports,
        a.dst_ports,
        a.priority,
    ) == (
        b.src,
        b.src_len,
        b.dst,
        b.dst_len,
        b.proto,
        b.src_ports,
        b.dst_ports,
        b.priority,
    )
}

impl Rules {
    fn new(list: Vec<Rule<RuleAction>>, capacity: usize) -> Self {
        let (inbound, outbound): (Vec<_>, Vec<_>) = list.iter().partition(|r| r.action.inbound);
        Rules {
            table: Ternary::build(&outbound),
            inbound: Ternary::build(&inbound),
            list,
            capacity,
        }
    }

    /// The rules after `writes`, and the ids whose counters restart; nothing if refused.
    fn updated(&self, writes: &[Write]) -> Result<RulesUpdate, ControlError> {
        let mut list = self.list.clone();
        let mut reset = Vec::new();
        let unnamed = RuleAction::named("deny", 0);
        for w in writes {
            let (key, priority) = match w {
                Write::Insert(e) | Write::Modify(e) => (&e.key, e.priority),
                // A delete names its rule by key alone when one rule has it; the key and
                // priority of a read's output also work.
                Write::Delete(k) => (k, u32::MAX),
            };
            let probe = rule_of(key, priority, unnamed);
            let at = list.iter().position(|r| {
                let mut r2 = probe;
                if priority == u32::MAX {
                    r2.priority = r.priority;
                }
                same_rule(r, &r2)
            });
            match (w, at) {
                (Write::Insert(_), Some(_)) => {
                    return Err(ControlError::Exists {
                        table: "rules".into(),
                    });
                }
                (Write::Modify(_) | Write::Delete(_), None) => {
                    return Err(ControlError::NoSuchEntry {
                        table: "rules".into(),
                    });
                }
                (Write::Insert(e), None) => {
                    let Some(id) = (0..self.capacity as u32)
                        .find(|id| !list.iter().any(|r| r.action.id == *id))
                    else {
                        return Err(ControlError::TableFull {
                            table: "rules".into(),
                            capacity: self.capacity,
                        });
                    };
                    list.push(rule_of(key, priority, RuleAction::named(&e.action, id)));
                    reset.push(id);
                }
                (Write::Modify(e), Some(i)) => {
                    list[i].action = RuleAction::named(&e.action, list[i].action.id);
                }
                (Write::Delete(_), Some(i)) => reset.push(list.remove(i).action.id),
            }
        }
        Ok(RulesUpdate {
            rules: Arc::new(Rules::new(list, self.capacity)),
            reset,
        })
    }
}

/// The next stage for permitted packets.
#[derive(Clone)]
enum Next {
    Forward(Forward),
    Router(Router),
}

#[derive(Clone)]
pub struct Acl {
    rules: Arc<Rules>,
    /// Whether rules take a direction (a `firewall`'s policy).
    directions: bool,
    /// The newest rules, shared by every instance: the control plane's instance replaces
    /// them with an updated copy, which the workers then take.
    newest: Arc<Mutex<Arc<Rules>>>,
    permit_by_default: bool,
    next: Next,
    /// Per rule id (the last index counts packets no rule matched): packets and bytes
    /// (frame lengths) of IPv4 packets, per worker.
    counters: Counters,
    /// Per rule id (the last for the default): a policer of the packets the rule permits;
    /// red ones are dropped (`policed`). Off until the control plane sets one. Per worker,
    /// so a rate holds for each worker's share of the traffic.
    meters: Vec<Meter>,
}

/// The counters' names in the control API, lane by lane of a counter (packets, bytes).
const COUNTER_NAMES: &[&str] = &["rule_packets", "rule_bytes"];

/// The counters in the control API: `rule_packets` and `rule_bytes`, one value per rule
/// and a last one for the default.
fn counter_declaration(name: &str, rules: usize) -> Declaration {
    Declaration {
        name: name.to_string(),
        capacity: rules + 1,
        guarantees: vec![Guarantee::Local],
        kind: Kind::Register { bits: 64 },
    }
}

/// The drop reason of denied packets: after the next stage's own reasons (`policed` comes
/// next).
fn denied(next: &Next) -> DropReason {
    DropReason::program(next_reasons(next).len() as u8)
}

fn next_reasons(next: &Next) -> &'static [&'static str] {
    match next {
        Next::Forward(f) => f.drop_reasons(),
        Next::Router(r) => r.drop_reasons(),
    }
}

fn permit(field: &str, text: &str) -> Result<bool, ConfigError> {
    match text {
        "permit" => Ok(true),
        "deny" => Ok(false),
        other => Err(ConfigError::new(
            field,
            format!("'{other}' is not an action; use permit or deny"),
        )),
    }
}

/// Whether a rule's `direction` is `in`; only a `firewall`'s rules (`directions`) have one.
fn inbound(field: &str, direction: Option<&str>, directions: bool) -> Result<bool, ConfigError> {
    match (direction, directions) {
        (None, _) => Ok(false),
        (Some(_), false) => Err(ConfigError::new(
            field,
            "an acl judges every packet, whichever port it came in on; a direction is for \
             firewall rules (which connections may be opened from outside): remove it",
        )),
        (Some("out"), true) => Ok(false),
        (Some("in"), true) => Ok(true),
        (Some(other), true) => Err(ConfigError::new(
            field,
            format!("'{other}' is not a direction; use out (the default) or in"),
        )),
    }
}

fn prefix(field: &str, text: &str) -> Result<(u32, u8), ConfigError> {
    if text == "any" {
        return Ok((0, 0));
    }
    match crate::parse_prefix(field, text)? {
        (IpAddr::V4(a), len) => Ok((u32::from(a), len)),
        (IpAddr::V6(_), _) => Err(ConfigError::new(
            field,
            format!("'{text}' is IPv6; acl rules match IPv4 (IPv6 packets take the default)"),
        )),
    }
}

fn ports(field: &str, text: &str) -> Result<(u16, u16), ConfigError> {
    let bad = || {
        ConfigError::new(
            field,
            format!("'{text}' is not a port, a range like 1024-65535, or any"),
        )
    };
    if text == "any" {
        return Ok((0, 65535));
    }
    let (lo, hi) = text.split_once('-').unwrap_or((text, text));
    let (lo, hi): (u16, u16) = (
        lo.parse().map_err(|_| bad())?,
        hi.parse().map_err(|_| bad())?,
    );
    if lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

fn proto(field: &str, text: &str) -> Result<Option<u8>, ConfigError> {
    match text {
        "any" => Ok(None),
        "tcp" => Ok(Some(6)),
        "udp" => Ok(Some(17)),
        "icmp" => Ok(Some(1)),
        n => n.parse().map(Some).map_err(|_| {
            ConfigError::new(
                field,
                format!("'{n}' is not a protocol; use tcp, udp, icmp, a number, or any"),
            )
        }),
    }
}

impl Acl {
    pub fn new(cfg: &AclConfig, names: &PortNames, field: &str) -> Result<Self, ConfigError> {
        Self::build(cfg, names, field, false)
    }

    /// A `firewall`'s policy: its rules may be for connections opened from outside.
    pub(crate) fn with_directions(
        cfg: &AclConfig,
        names: &PortNames,
        field: &str,
    ) -> Result<Self, ConfigError> {
        Self::build(cfg, names, field, true)
    }

    fn build(
        cfg: &AclConfig,
        names: &PortNames,
        field: &str,
        directions: bool,
    ) -> Result<Self, ConfigError> {
        if cfg.capacity == 0 || cfg.capacity > 1 << 20 || cfg.capacity < cfg.rules.len() {
            return Err(ConfigError::new(
                format!("{field}.capacity"),
                format!(
                    "give {} to 1048576 rules (at least the {} configured)",
                    cfg.rules.len().max(1),
                    cfg.rules.len()
                ),
            ));
        }
        let mut rules = Vec::with_capacity(cfg.rules.len());
        for (i, r) in cfg.rules.iter().enumerate() {
            let f = format!("{field}.rules[{i}]");
            let ((src, src_len), (dst, dst_len), proto, src_ports, dst_ports) = r.matched(&f)?;
            rules.push(Rule {
                src,
                src_len,
                dst,
                dst_len,
                proto,
                src_ports,
                dst_ports,
                // First match wins: earlier rules rank higher.
                priority: (cfg.rules.len() - i) as u32,
                action: RuleAction {
                    permit: permit(&format!("{f}.action"), &r.action)?,
                    id: i as u32,
                    inbound: inbound(
                        &format!("{f}.direction"),
                        r.direction.as_deref(),
                        directions,
                    )?,
                },
            });
        }
        let next = match &cfg.router {
            Some(rc) => {
                if !cfg.map.is_empty() {
                    return Err(ConfigError::new(
                        format!("{field}.map"),
                        "give either map (forward) or [router], not both",
                    ));
                }
                Next::Router(Router::new(rc, names, &format!("{field}.router"))?)
            }
            None => Next::Forward(Forward::new(
                &ForwardConfig {
                    map: cfg.map.clone(),
                },
                names,
                field,
            )?),
        };
        // A counter and a meter for every rule the capacity allows, in each copy.
        let per_rule = std::mem::size_of::<PacketBytes>() + std::mem::size_of::<Meter>();
        crate::claim_bytes(
            &format!("{field}.capacity"),
            || format!("counters and meters of {} rules", cfg.capacity),
            ((cfg.capacity + 1) * per_rule) as u64,
        )?;
        // The rule tables every worker shares, two versions at once while one replaces
        // the other: each its ternary table and its list.
        let versions = 2
            * (Ternary::<RuleAction>::bytes_for(cfg.capacity)
                + (cfg.capacity * std::mem::size_of::<Rule<RuleAction>>()) as u64);
        let capacity_field = format!("{field}.capacity");
        stateplane_mem::budget::claim_once(
            &capacity_field,
            || format!("two versions of the rule tables of {} rules", cfg.capacity),
            versions,
        )
        .map_err(|e| ConfigError::new(capacity_field, e.to_string()))?;
        let rules = Arc::new(Rules::new(rules, cfg.capacity));
        Ok(Acl {
            directions,
            counters: Counters::new(cfg.capacity + 1),
            // Zeroed memory is meters that are off: touched as rules get meters.
            meters: bytemuck::zeroed_vec(cfg.capacity + 1),
            newest: Arc::new(Mutex::new(rules.clone())),
            rules,
            permit_by_default: permit(
                &format!("{field}.default"),
                cfg.default.as_deref().unwrap_or("deny"),
            )?,
            next,
        })
    }
}

/// What the access list makes of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judgement {
    Permit,
    Deny,
    /// Permitted, but over its rule's policer.
    Policed,
}

impl Acl {
    /// Classifies one packet, counting it against the rule that matched (or the default)
    /// and its policer.
    pub(crate) fn judge(&mut self, d: &PacketDesc) -> Judgement {
        let Some(p) = packet5(d) else {
            return if self.permit_by_default {
                Judgement::Permit
            } else {
                Judgement::Deny
            };
        };
        let rule = self.rules.table.classify(&p).map(|r| r.action);
        let default = self.counters.len() - 1;
        self.decide(
            rule.map_or((default, self.permit_by_default), |a| {
                (a.id as usize, a.permit)
            }),
            d,
        )
    }

    /// Classifies a packet from outside that opens a connection by the inbound rules,
    /// counting it as [`Acl::judge`] does; `None` when no inbound rule matches (IPv6
    /// never does), which is not counted: nothing from outside has a default.
    pub(crate) fn judge_inbound(&mut self, d: &PacketDesc) -> Option<Judgement> {
        // Most firewalls let nothing in: what comes unsolicited then costs one test.
        if self.rules.inbound.is_empty() {
            return None;
        }
        let rule = self.rules.inbound.classify(&packet5(d)?)?.action;
        Some(self.decide((rule.id as usize, rule.permit), d))
    }

    /// Counts `d` against rule `index` (the last: the default) and judges it by the
    /// rule's action, `permit`, and its policer.
    fn decide(&mut self, (index, permit): (usize, bool), d: &PacketDesc) -> Judgement {
        self.counters.count(index, d.len);
        if !permit {
            Judgement::Deny
        } else if self.meters[index].mark(d.len, d.ts_ns, None) == Colour::Red {
            Judgement::Policed
        } else {
            Judgement::Permit
        }
    }
}

/// The fields rules classify an IPv4 packet on; `None` for others.
fn packet5(d: &PacketDesc) -> Option<Packet5> {
    let k = &d.parsed.key;
    (k.ip_version == 4).then(|| Packet5 {
        src: u32::from_be_bytes([k.src[0], k.src[1], k.src[2], k.src[3]]),
        dst: u32::from_be_bytes([k.dst[0], k.dst[1], k.dst[2], k.dst[3]]),
        proto: k.proto,
        src_port: k.src_port,
        dst_port: k.dst_port,
    })
}

/// What may be synced: the rule counters, packets and bytes (the rules are the control
/// plane's, written through its API).
impl crate::synced_parts::SyncedParts for Acl {
    fn synced_views(&self, f: &mut dyn FnMut(&dyn crate::synced_parts::SyncedView)) {
        f(&crate::synced_parts::LanesView(&self.counters));
    }

    fn synced_parts(&mut self, f: &mut dyn FnMut(&mut dyn crate::synced_parts::SyncedPart)) {
        f(&mut crate::synced_parts::LanesPart {
            names: COUNTER_NAMES,
            register: &mut self.counters,
        });
    }
}

impl Program for Acl {
    type Prepared = Prepared;

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        match &mut self.next {
            Next::Forward(f) => f.process(burst, ctx),
            Next::Router(r) => r.process(burst, ctx),
        }
        let deny = denied(&self.next);
        let policed = DropReason::program(next_reasons(&self.next).len() as u8 + 1);
        for d in burst.descs_mut() {
            match self.judge(d) {
                Judgement::Permit => {}
                Judgement::Deny => d.verdict = Verdict::Drop(deny),
                Judgement::Policed => d.verdict = Verdict::Drop(policed),
            }
        }
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        match self.next {
            Next::Forward(_) => &["no_mapping", "denied", "policed"],
            Next::Router(_) => &["no_route", "ttl_expired", "denied", "policed"],
        }
    }

    crate::synced_parts::synced_parts_methods!();

    fn declarations(&self) -> Vec<Declaration> {
        let mut d = vec![
            rules_declaration(self.rules.capacity, self.directions),
            counter_declaration(COUNTER_NAMES[0], self.counters.len() - 1),
            counter_declaration(COUNTER_NAMES[1], self.counters.len() - 1),
            Declaration {
                name: "rule_meters".into(),
                capacity: self.meters.len(),
                guarantees: vec![Guarantee::Local],
                kind: Kind::Meters,
            },
        ];
        if let Next::Router(r) = &self.next {
            d.extend(r.declarations());
        }
        d
    }

    fn prepare(&self, request: &Request) -> Result<Option<Arc<Prepared>>, ControlError> {
        match (request, &self.next) {
            (Request::Write { table, writes }, _) if table == "rules" => {
                let mut newest = self.newest.lock().unwrap_or_else(PoisonError::into_inner);
                let update = newest.updated(writes)?;
                *newest = update.rules.clone();
                Ok(Some(Arc::new(Prepared::Rules(update))))
            }
            (_, Next::Router(r)) if request.target().starts_with("routes") => {
                Ok(r.prepare(request)?.map(|t| Arc::new(Prepared::Routes(t))))
            }
            _ => Ok(None),
        }
    }

    fn control(
        &mut self,
        request: &Request,
        prepared: Option<&Arc<Prepared>>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        match (request, &mut self.next) {
            (Request::Write { table, .. }, _) if table == "rules" => {
                let Some(Prepared::Rules(update)) = prepared.map(|p| p.as_ref()) else {
                    return Err(ControlError::Unavailable);
                };
                for &id in &update.reset {
                    let _ = self.counters.write(id as usize, PacketBytes::default());
                    if let Some(m) = self.meters.get_mut(id as usize) {
                        *m = Meter::Off;
                    }
                }
                self.rules = update.rules.clone();
                Ok(Reply::Done)
            }
            (Request::Read { table, key, from }, _) if table == "rules" => {
                // Every worker answers: each counts its own share of a rule's packets.
                let hits = |r: &Rule<RuleAction>| {
                    let c = self.counters.read(r.action.id as usize);
                    c.map_or(0, |c| c.packets)
                };
                let list = &self.rules.list;
                if let Some(key) = key {
                    let entries: Vec<Entry> = list
                        .iter()
                        .map(|r| entry_of(r, hits(r)))
                        .filter(|e| e.key == *key)
                        .collect();
                    if entries.is_empty() {
                        return Err(ControlError::NoSuchEntry {
                            table: table.clone(),
                        });
                    }
                    return Ok(Reply::Page(entries, None));
                }
                let (rules, next) = page(list.iter(), *from, list.len());
                let entries = rules.into_iter().map(|r| entry_of(r, hits(r))).collect();
                Ok(Reply::Page(entries, next))
            }
            (
                Request::SetMeter {
                    first,
                    count,
                    config,
                    ..
                },
                _,
            ) => {
                for m in &mut self.meters[*first..first + count] {
                    *m = Meter::new(*config, ctx.now_ns);
                }
                Ok(Reply::Done)
            }
            (Request::ReadMeter { first, count, .. }, _) => Ok(Reply::Meters(
                self.meters[*first..first + count]
                    .iter()
                    .map(Meter::config)
                    .collect(),
            )),
            (Request::ReadRegister { name, first, count }, _) => {
                let values = self
                    .counters
                    .range(*first, first + count)
                    .map_err(|e| ControlError::OutOfRange {
                        name: name.clone(),
                        index: e.index,
                        size: e.size,
                    })?
                    .iter()
                    .map(|c| {
                        u128::from(if name == COUNTER_NAMES[0] {
                            c.packets
                        } else {
                            c.bytes
                        })
                    })
                    .collect();
                Ok(Reply::Values(values))
            }
            (
                Request::WriteRegister {
                    name,
                    first,
                    count,
                    value,
                },
                _,
            ) => {
                let v = *value as u64;
                for i in *first..first + count {
                    self.counters.update(i, |c| {
                        if name == COUNTER_NAMES[0] {
                            c.packets = v;
                        } else {
                            c.bytes = v;
                        }
                    });
                }
                Ok(Reply::Done)
            }
            (_, Next::Router(r)) => {
                let tables = match prepared.map(|p| p.as_ref()) {
                    Some(Prepared::Routes(tables)) => Some(tables),
                    _ => None,
                };
                r.control(request, tables, ctx)
            }
            _ => Err(ControlError::Unavailable),
        }
    }

    /// The rules, the meters and any routes are the new configuration's; the counts start
    /// again with them, as iptables-restore's and `pfctl -f`'s do.
    fn inherit(&mut self, _old: Self, _now_ns: u64) -> Vec<stateplane_state::Carried> {
        (self.declarations().iter())
            .map(|d| match d.name.as_str() {
                "rule_packets" | "rule_bytes" => stateplane_state::Carried::afresh(
                    &d.name,
                    "rule counts start again with the configuration's rules",
                ),
                _ => stateplane_state::Carried::configured(&d.name),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_gen::build::{Hosts, L4, emit_frame};
    use stateplane_wire::ethernet::MacAddr;

    fn frame(src: &str, dst: &str, l4: L4) -> Vec<u8> {
        let hosts = Hosts {
            src_mac: MacAddr([2, 0, 0, 0, 0, 9]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            vlan: 0,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            ttl: 64,
        };
        let mut f = Vec::new();
        emit_frame(&mut f, &hosts, &l4, b"x");
        f
    }

    fn tcp(dst_port: u16) -> L4 {
        L4::Tcp {
            src_port: 40000,
            dst_port,
            seq: 0,
            ack: 0,
            flags: 2,
        }
    }

    fn run(acl: &mut Acl, frames: &[Vec<u8>]) -> Vec<Verdict> {
        let b = crate::testutil::run(acl, frames, 2);
        b.descs().iter().map(|d| d.verdict).collect()
    }

    const CONFIG: &str = r#"
        default = "deny"
        rules = [
          { action = "deny",   src = "198.18.0.66", proto = "tcp" },
          { action = "permit", dst = "198.19.0.0/16", proto = "tcp", dst_ports = "80" },
          { action = "permit", dst = "198.19.0.0/16", proto = "udp", dst_ports = "1024-65535" },
        ]
    "#;

    #[test]
    fn first_match_wins_then_forwards_or_routes() {
        let names = PortNames(vec!["in".into(), "out".into()]);
        let cfg: AclConfig = toml::from_str(CONFIG).unwrap();
        let mut acl = Acl::new(&cfg, &names, "program.acl").unwrap();
        let deny = Verdict::Drop(DropReason::program(1));
        let got = run(
            &mut acl,
            &[
                frame("198.18.0.1", "198.19.3.4", tcp(80)),
                frame("198.18.0.66", "198.19.3.4", tcp(80)),
                frame("198.18.0.1", "198.19.3.4", tcp(22)),
                frame(
                    "198.18.0.1",
                    "198.19.3.4",
                    L4::Udp {
                        src_port: 53,
                        dst_port: 5000,
                    },
                ),
                frame(
                    "198.18.0.1",
                    "198.19.3.4",
                    L4::Udp {
                        src_port: 53,
                        dst_port: 53,
                    },
                ),
            ],
        );
        assert_eq!(
            got,
            [Verdict::Forward(1), deny, deny, Verdict::Forward(1), deny],
        );
        assert_eq!(acl.drop_reasons()[1], "denied");
        // The same list in front of a router: permitted packets are routed.
        let with_router = format!(
            "{CONFIG}\n[router]\nroutes = [{{ prefix = \"198.19.0.0/16\", port = \"out\", next_hop_mac = \"02:00:00:00:00:77\" }}]"
        );
        let cfg: AclConfig = toml::from_str(&with_router).unwrap();
        let mut acl = Acl::new(&cfg, &names, "program.acl").unwrap();
        let got = run(
            &mut acl,
            &[
                frame("198.18.0.1", "198.19.3.4", tcp(80)),
                frame("198.18.0.66", "198.19.3.4", tcp(80)),
            ],
        );
        assert_eq!(
            got,
            [Verdict::Forward(1), Verdict::Drop(DropReason::program(2))]
        );
        assert_eq!(acl.drop_reasons()[2], "denied");
    }

    /// The acl's reason names are its next stage's, then `denied` and `policed`, at the
    /// indices the data plane uses: the lists are written apart, so this keeps them together.
    #[test]
    fn drop_reason_names_extend_the_next_stage() {
        let names = PortNames(vec!["in".into(), "out".into()]);
        for text in ["", "[router]\nroutes = []"] {
            let cfg: AclConfig = toml::from_str(text).unwrap();
            let acl = Acl::new(&cfg, &names, "program.acl").unwrap();
            let next = next_reasons(&acl.next);
            let all = acl.drop_reasons();
            assert_eq!(&all[..next.len()], next);
            assert_eq!(
                all[usize::from(denied(&acl.next).0 - DropReason::PROGRAM_BASE)],
                "denied"
            );
            assert_eq!(all[next.len() + 1], "policed");
            assert_eq!(all.len(), next.len() + 2);
        }
    }

    #[test]
    fn bad_rules_name_the_field() {
        let names = PortNames(vec!["in".into(), "out".into()]);
        for (text, field) in [
            (
                r#"rules = [{ action = "allow" }]"#,
                "program.acl.rules[0].action",
            ),
            (
                r#"rules = [{ action = "deny", src = "198.18.0.0/40" }]"#,
                "program.acl.rules[0].src",
            ),
            (
                r#"rules = [{ action = "deny", dst_ports = "90-80" }]"#,
                "program.acl.rules[0].dst_ports",
            ),
            (
                r#"rules = [{ action = "deny", proto = "sctpx" }]"#,
                "program.acl.rules[0].proto",
            ),
            // An acl judges every packet, whichever way: directions are firewall's.
            (
                r#"rules = [{ action = "deny", direction = "in" }]"#,
                "program.acl.rules[0].direction",
            ),
        ] {
            let cfg: AclConfig = toml::from_str(text).unwrap();
            let e = Acl::new(&cfg, &names, "program.acl").err().unwrap();
            assert_eq!(e.field, field);
        }
    }
}
