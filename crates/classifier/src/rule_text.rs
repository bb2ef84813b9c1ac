//! Rules as text, in the spirit of `ovs-ofctl add-flow`, one rule per line:
//!
//! ```text
//! table=0,priority=200,tcp,nw_dst=198.19.0.0/16,tp_dst=80,actions=mod_dl_dst:02:00:00:00:0b:01,output:1
//! table=0,priority=10,ip,actions=goto_table:1
//! ```
//!
//! Match fields: `in_port`, `dl_src`/`dl_dst` (MAC, optionally `/MASK`), `dl_vlan`,
//! `dl_type`, `nw_src`/`nw_dst` (IPv4 prefix), `ipv6_src`/`ipv6_dst` (IPv6 prefix),
//! `nw_proto`, `tp_src`/`tp_dst` (a port or a range `LOW-HIGH`), `tcp_flags` (`VALUE/MASK`);
//! shorthands `ip`, `ipv6`, `arp`, `tcp`, `udp`, `icmp`, `tcp6`, `udp6`, `icmp6`. Also
//! `table` (default 0), `priority` (default 32768, as OVS), `cookie`, `idle_timeout`,
//! `hard_timeout` (seconds). After `actions=` (last): `output:PORT`, `controller`, `drop`,
//! `dec_ttl`, `mod_vlan_vid:ID` (push or replace a tag), `strip_vlan`, `mod_dl_src:MAC`,
//! `mod_dl_dst:MAC`, `mod_nw_src:IP`, `mod_nw_dst:IP`, `mod_tp_src:PORT`,
//! `mod_tp_dst:PORT`, `goto_table:N`. Unknown words are errors that name the word.

use crate::fields::{Fields, mapped};
use crate::rule::{Action, Pattern, Rule, SetField};
use stateplane_wire::MacAddr;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// A word of a rule that could not be read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleParseError {
    pub word: String,
    pub problem: String,
}

impl fmt::Display for RuleParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "'{}': {}", self.word, self.problem)
    }
}

impl std::error::Error for RuleParseError {}

/// A word of a rule that was read but probably does not say what its writer meant (a mask
/// of zero: the field matches every packet). Named the way an error names its word.
pub type RuleWarning = RuleParseError;

fn bad(word: &str, problem: impl Into<String>) -> RuleParseError {
    RuleParseError {
        word: word.to_string(),
        problem: problem.into(),
    }
}

fn int<T: TryFrom<u64>>(word: &str, text: &str) -> Result<T, RuleParseError> {
    let v = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse::<u64>(),
    }
    .map_err(|_| bad(word, format!("'{text}' is not a number")))?;
    T::try_from(v).map_err(|_| bad(word, format!("{v} is too large here")))
}

fn mac(word: &str, text: &str) -> Result<u64, RuleParseError> {
    text.parse::<MacAddr>()
        .map(|m| m.to_u64())
        .map_err(|_| bad(word, format!("'{text}' is not a MAC address")))
}

/// A prefix `ADDR/LEN` (or an address: all bits) as a value and mask in the 128-bit field.
fn prefix(word: &str, text: &str, v6: bool) -> Result<(u128, u128), RuleParseError> {
    let (addr, len) = text
        .split_once('/')
        .unwrap_or((text, if v6 { "128" } else { "32" }));
    let len: u32 = len
        .parse()
        .ok()
        .filter(|&l| l <= if v6 { 128 } else { 32 })
        .ok_or_else(|| bad(word, format!("'{len}' is not a prefix length")))?;
    let (value, len) = if v6 {
        let a: Ipv6Addr = addr
            .parse()
            .map_err(|_| bad(word, format!("'{addr}' is not an IPv6 address")))?;
        (u128::from(a), len)
    } else {
        let a: Ipv4Addr = addr
            .parse()
            .map_err(|_| bad(word, format!("'{addr}' is not an IPv4 address")))?;
        (mapped(u32::from(a)), 96 + len)
    };
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    };
    Ok((value & mask, mask))
}

fn ip(word: &str, text: &str) -> Result<u128, RuleParseError> {
    if let Ok(a) = text.parse::<Ipv4Addr>() {
        return Ok(mapped(u32::from(a)));
    }
    text.parse::<Ipv6Addr>()
        .map(u128::from)
        .map_err(|_| bad(word, format!("'{text}' is not an IP address")))
}

fn range(word: &str, text: &str) -> Result<(u16, u16), RuleParseError> {
    let (lo, hi) = text.split_once('-').unwrap_or((text, text));
    let (lo, hi): (u16, u16) = (int(word, lo)?, int(word, hi)?);
    if lo > hi {
        return Err(bad(word, "the range is empty (LOW-HIGH, LOW at most HIGH)"));
    }
    Ok((lo, hi))
}

/// The largest VLAN id (12 bits).
const VLAN_MAX: u16 = 4095;

fn vlan_id(word: &str, text: &str) -> Result<u16, RuleParseError> {
    let id: u16 = int(word, text)?;
    if id > VLAN_MAX {
        return Err(bad(
            word,
            format!("{id} is not a VLAN id (0 to {VLAN_MAX})"),
        ));
    }
    Ok(id)
}

/// The field of the match a word sets, for finding a field given twice; a shorthand sets
/// the Ethernet type and maybe the IP protocol.
fn fields_set(key: &str) -> &'static [&'static str] {
    match key {
        "ip" | "ipv6" | "arp" | "dl_type" => &["dl_type"],
        "tcp" | "udp" | "icmp" | "tcp6" | "udp6" | "icmp6" => &["dl_type", "nw_proto"],
        "nw_src" | "ipv6_src" => &["source address"],
        "nw_dst" | "ipv6_dst" => &["destination address"],
        "table" => &["table"],
        "priority" => &["priority"],
        "cookie" => &["cookie"],
        "idle_timeout" => &["idle_timeout"],
        "hard_timeout" => &["hard_timeout"],
        "in_port" => &["in_port"],
        "dl_src" => &["dl_src"],
        "dl_dst" => &["dl_dst"],
        "dl_vlan" => &["dl_vlan"],
        "nw_proto" => &["nw_proto"],
        "tp_src" => &["tp_src"],
        "tp_dst" => &["tp_dst"],
        "tcp_flags" => &["tcp_flags"],
        _ => &[],
    }
}

/// Reads one rule. See the module documentation for the words.
pub fn parse_rule(line: &str) -> Result<Rule, RuleParseError> {
    parse_rule_warning(line).map(|(rule, _)| rule)
}

/// Reads one rule, and says which of its words probably do not mean what they say (see
/// [`RuleWarning`]).
///
/// Refused rather than read some other way: a value past its field (a VLAN id past 4095),
/// a field given twice or two words that disagree on one (`tcp,nw_proto=17`), an IPv4
/// prefix in an IPv6 rule or the other way round, an empty action list, and `drop` beside
/// other actions.
pub fn parse_rule_warning(line: &str) -> Result<(Rule, Vec<RuleWarning>), RuleParseError> {
    let (head, actions) = match line.find("actions=") {
        Some(at) => (&line[..at], &line[at + "actions=".len()..]),
        None => return Err(bad(line.trim(), "a rule ends with actions=...")),
    };
    let mut rule = Rule {
        table: 0,
        priority: 32768,
        cookie: 0,
        pattern: Pattern::ANY,
        actions: Vec::new(),
        goto: None,
        idle_timeout: 0,
        hard_timeout: 0,
    };
    let (v, m) = (&mut rule.pattern.value, &mut rule.pattern.mask);
    let ether = |v: &mut Fields, m: &mut Fields, t: u16| {
        v.eth_type = t;
        m.eth_type = u16::MAX;
    };
    let proto = |v: &mut Fields, m: &mut Fields, p: u8| {
        v.ip_proto = p;
        m.ip_proto = u8::MAX;
    };
    let mut warnings = Vec::new();
    // Each field the match sets, with the word that set it and the match as it stood.
    let mut set_by: Vec<(&str, &str)> = Vec::new();
    for word in head.split([',', ' ', '\t']).filter(|w| !w.is_empty()) {
        let (key, text) = word.split_once('=').unwrap_or((word, ""));
        let before = (v.eth_type, v.ip_proto);
        match key {
            "ip" | "ipv6" | "arp" | "tcp" | "udp" | "icmp" | "tcp6" | "udp6" | "icmp6" => {
                let (ethertype, ip_proto) = match key {
                    "ip" => (0x0800, None),
                    "ipv6" => (0x86dd, None),
                    "arp" => (0x0806, None),
                    "tcp" => (0x0800, Some(6)),
                    "udp" => (0x0800, Some(17)),
                    "icmp" => (0x0800, Some(1)),
                    "tcp6" => (0x86dd, Some(6)),
                    "udp6" => (0x86dd, Some(17)),
                    _ => (0x86dd, Some(58)),
                };
                ether(v, m, ethertype);
                if let Some(p) = ip_proto {
                    proto(v, m, p);
                }
            }
            "table" => rule.table = int(word, text)?,
            "priority" => rule.priority = int(word, text)?,
            "cookie" => rule.cookie = int(word, text)?,
            "idle_timeout" => rule.idle_timeout = int(word, text)?,
            "hard_timeout" => rule.hard_timeout = int(word, text)?,
            "in_port" => {
                v.in_port = int(word, text)?;
                m.in_port = u16::MAX;
            }
            "dl_src" | "dl_dst" => {
                let (value, mask) = match text.split_once('/') {
                    Some((a, b)) => (mac(word, a)?, mac(word, b)?),
                    None => (mac(word, text)?, 0xffff_ffff_ffff),
                };
                let (fv, fm) = if key == "dl_src" {
                    (&mut v.eth_src, &mut m.eth_src)
                } else {
                    (&mut v.eth_dst, &mut m.eth_dst)
                };
                (*fv, *fm) = (value & mask, mask);
            }
            "dl_vlan" => {
                v.vlan = vlan_id(word, text)?;
                m.vlan = VLAN_MAX;
            }
            "dl_type" => ether(v, m, int(word, text)?),
            "nw_src" | "nw_dst" | "ipv6_src" | "ipv6_dst" => {
                let (value, mask) = prefix(word, text, key.starts_with("ipv6"))?;
                let (fv, fm) = if key.ends_with("src") {
                    (&mut v.ip_src, &mut m.ip_src)
                } else {
                    (&mut v.ip_dst, &mut m.ip_dst)
                };
                (*fv, *fm) = (value, mask);
            }
            "nw_proto" => proto(v, m, int(word, text)?),
            "tp_src" => rule.pattern.tp_src = range(word, text)?,
            "tp_dst" => rule.pattern.tp_dst = range(word, text)?,
            "tcp_flags" => {
                let (value, mask) = text.split_once('/').unwrap_or((text, "0xff"));
                v.tcp_flags = int(word, value)?;
                m.tcp_flags = int(word, mask)?;
            }
            _ => {
                return Err(bad(
                    word,
                    "not a match field (see the rule format in docs/cli.md)",
                ));
            }
        }
        for &field in fields_set(key) {
            let Some(&(_, first)) = set_by.iter().find(|(f, _)| *f == field) else {
                set_by.push((field, word));
                continue;
            };
            // Shorthands may overlap where they agree (`ip,tcp`); nothing else may.
            let first_key = first.split_once('=').map_or(first, |(k, _)| k);
            let agrees = match field {
                "dl_type" => before.0 == v.eth_type,
                "nw_proto" => before.1 == v.ip_proto,
                _ => false,
            };
            if first_key == key || !agrees {
                return Err(bad(
                    word,
                    format!("the {field} is already given by '{first}'; give it once"),
                ));
            }
        }
        let ports = (rule.pattern.tp_src, rule.pattern.tp_dst);
        if let Some(warning) = zero_mask(key, word, m, ports) {
            warnings.push(warning);
        }
    }
    check_family(&set_by, &rule.pattern)?;
    rule.pattern = rule.pattern.normalized();
    let action_words: Vec<&str> = (actions.split([',', ' ', '\t']))
        .filter(|w| !w.is_empty())
        .collect();
    match action_words.as_slice() {
        [] => {
            return Err(bad(
                line.trim(),
                "the action list is empty; to drop the packets it matches, say actions=drop",
            ));
        }
        [_, _, ..] if action_words.contains(&"drop") => {
            return Err(bad(
                "drop",
                "drop stands alone in an action list (a rule with no output drops)",
            ));
        }
        _ => {}
    }
    for word in action_words {
        let (name, arg) = word.split_once(':').unwrap_or((word, ""));
        let action = match name {
            "drop" => continue,
            "output" => Action::Output(int(word, arg)?),
            "controller" => Action::Controller,
            "dec_ttl" => Action::DecTtl,
            "strip_vlan" | "pop_vlan" => Action::PopVlan,
            "mod_vlan_vid" | "push_vlan" => Action::PushVlan(vlan_id(word, arg)?),
            "mod_dl_src" => Action::Set(SetField::EthSrc(mac(word, arg)?)),
            "mod_dl_dst" => Action::Set(SetField::EthDst(mac(word, arg)?)),
            "mod_nw_src" => Action::Set(SetField::IpSrc(ip(word, arg)?)),
            "mod_nw_dst" => Action::Set(SetField::IpDst(ip(word, arg)?)),
            "mod_tp_src" => Action::Set(SetField::TpSrc(int(word, arg)?)),
            "mod_tp_dst" => Action::Set(SetField::TpDst(int(word, arg)?)),
            "goto_table" => {
                rule.goto = Some(int(word, arg)?);
                continue;
            }
            _ => {
                return Err(bad(
                    word,
                    "not an action (see the rule format in docs/cli.md)",
                ));
            }
        };
        if rule.goto.is_some() {
            return Err(bad(word, "goto_table comes last in the actions"));
        }
        rule.actions.push(action);
    }
    Ok((rule, warnings))
}

/// A warning when the word for `key` left its field under a mask of zero (or a port range
/// of every port): the field then matches every packet, which a writer who gave it rarely
/// means.
fn zero_mask(
    key: &str,
    word: &str,
    m: &Fields,
    (tp_src, tp_dst): ((u16, u16), (u16, u16)),
) -> Option<RuleWarning> {
    let matches_all = match key {
        "dl_src" => m.eth_src == 0,
        "dl_dst" => m.eth_dst == 0,
        // An IPv4 prefix is the low 32 bits of an IPv4-mapped address: /0 leaves 96 bits.
        "nw_src" => m.ip_src.leading_ones() <= 96,
        "nw_dst" => m.ip_dst.leading_ones() <= 96,
        "ipv6_src" => m.ip_src == 0,
        "ipv6_dst" => m.ip_dst == 0,
        "tcp_flags" => m.tcp_flags == 0,
        "tp_src" => tp_src == (0, u16::MAX),
        "tp_dst" => tp_dst == (0, u16::MAX),
        _ => false,
    };
    matches_all.then(|| {
        bad(
            word,
            "its mask is zero, so it matches every packet; leave it out if that is meant",
        )
    })
}

/// An IPv4 prefix in a rule that matches IPv6 packets (or an IPv6 prefix in one matching
/// IPv4) can never match: refused, naming the word and the one to use.
fn check_family(set_by: &[(&str, &str)], pattern: &Pattern) -> Result<(), RuleParseError> {
    let (v, m) = (&pattern.value, &pattern.mask);
    let family = match (m.eth_type, v.eth_type) {
        (u16::MAX, 0x0800) => "IPv4",
        (u16::MAX, 0x86dd) => "IPv6",
        _ => return Ok(()),
    };
    for &(_, word) in set_by {
        let key = word.split_once('=').map_or(word, |(k, _)| k);
        let (prefix_family, instead) = match key {
            "nw_src" => ("IPv4", "ipv6_src"),
            "nw_dst" => ("IPv4", "ipv6_dst"),
            "ipv6_src" => ("IPv6", "nw_src"),
            "ipv6_dst" => ("IPv6", "nw_dst"),
            _ => continue,
        };
        if prefix_family != family {
            return Err(bad(
                word,
                format!(
                    "an {prefix_family} prefix in a rule that matches {family} packets never \
                     matches; use {instead}, or match {prefix_family}"
                ),
            ));
        }
    }
    Ok(())
}

/// Writes a rule in the form [`parse_rule`] reads (every field it matches, explicitly):
/// what `dump-flows` shows.
pub fn format_rule(rule: &Rule) -> String {
    let (v, m) = (&rule.pattern.value, &rule.pattern.mask);
    let mut words = vec![
        format!("table={}", rule.table),
        format!("priority={}", rule.priority),
    ];
    if rule.cookie != 0 {
        words.push(format!("cookie={:#x}", rule.cookie));
    }
    for (name, t) in [
        ("idle_timeout", rule.idle_timeout),
        ("hard_timeout", rule.hard_timeout),
    ] {
        if t != 0 {
            words.push(format!("{name}={t}"));
        }
    }
    if m.in_port != 0 {
        words.push(format!("in_port={}", v.in_port));
    }
    for (name, value, mask) in [
        ("dl_src", v.eth_src, m.eth_src),
        ("dl_dst", v.eth_dst, m.eth_dst),
    ] {
        match mask {
            0 => {}
            0xffff_ffff_ffff => words.push(format!("{name}={}", MacAddr::from_u64(value))),
            _ => words.push(format!(
                "{name}={}/{}",
                MacAddr::from_u64(value),
                MacAddr::from_u64(mask)
            )),
        }
    }
    if m.vlan != 0 {
        words.push(format!("dl_vlan={}", v.vlan));
    }
    // The shorthands the parser reads, where they say it all (as ovs-ofctl prints).
    let proto = (m.ip_proto == u8::MAX).then_some(v.ip_proto);
    let shorthand = match (m.eth_type == u16::MAX, v.eth_type, proto) {
        (true, 0x0800, Some(6)) => Some(("tcp", true)),
        (true, 0x0800, Some(17)) => Some(("udp", true)),
        (true, 0x0800, Some(1)) => Some(("icmp", true)),
        (true, 0x86dd, Some(6)) => Some(("tcp6", true)),
        (true, 0x86dd, Some(17)) => Some(("udp6", true)),
        (true, 0x86dd, Some(58)) => Some(("icmp6", true)),
        (true, 0x0800, _) => Some(("ip", false)),
        (true, 0x86dd, _) => Some(("ipv6", false)),
        (true, 0x0806, _) => Some(("arp", false)),
        _ => None,
    };
    match shorthand {
        Some((word, _)) => words.push(word.into()),
        None if m.eth_type != 0 => words.push(format!("dl_type={:#06x}", v.eth_type)),
        None => {}
    }
    let proto_said = shorthand.is_some_and(|(_, p)| p);
    for (side, value, mask) in [("src", v.ip_src, m.ip_src), ("dst", v.ip_dst, m.ip_dst)] {
        if mask == 0 {
            continue;
        }
        let len = mask.leading_ones();
        if len >= 96 && value >> 32 == 0xffff {
            let a = Ipv4Addr::from(value as u32);
            words.push(format!("nw_{side}={a}/{}", len - 96));
        } else {
            words.push(format!("ipv6_{side}={}/{len}", Ipv6Addr::from(value)));
        }
    }
    if m.ip_proto != 0 && !proto_said {
        words.push(format!("nw_proto={}", v.ip_proto));
    }
    for (name, (lo, hi)) in [
        ("tp_src", rule.pattern.tp_src),
        ("tp_dst", rule.pattern.tp_dst),
    ] {
        match (lo, hi) {
            (0, u16::MAX) => {}
            (lo, hi) if lo == hi => words.push(format!("{name}={lo}")),
            (lo, hi) => words.push(format!("{name}={lo}-{hi}")),
        }
    }
    if m.tcp_flags != 0 {
        words.push(format!(
            "tcp_flags={:#04x}/{:#04x}",
            v.tcp_flags, m.tcp_flags
        ));
    }
    let ip = |a: u128| {
        if a >> 32 == 0xffff {
            Ipv4Addr::from(a as u32).to_string()
        } else {
            Ipv6Addr::from(a).to_string()
        }
    };
    let mut actions: Vec<String> = (rule.actions.iter())
        .map(|a| match *a {
            Action::Output(p) => format!("output:{p}"),
            Action::Controller => "controller".into(),
            Action::DecTtl => "dec_ttl".into(),
            Action::PopVlan => "strip_vlan".into(),
            Action::PushVlan(id) => format!("mod_vlan_vid:{id}"),
            Action::Set(SetField::EthSrc(mac)) => format!("mod_dl_src:{}", MacAddr::from_u64(mac)),
            Action::Set(SetField::EthDst(mac)) => format!("mod_dl_dst:{}", MacAddr::from_u64(mac)),
            Action::Set(SetField::IpSrc(a)) => format!("mod_nw_src:{}", ip(a)),
            Action::Set(SetField::IpDst(a)) => format!("mod_nw_dst:{}", ip(a)),
            Action::Set(SetField::TpSrc(p)) => format!("mod_tp_src:{p}"),
            Action::Set(SetField::TpDst(p)) => format!("mod_tp_dst:{p}"),
        })
        .collect();
    if let Some(t) = rule.goto {
        actions.push(format!("goto_table:{t}"));
    }
    if actions.is_empty() {
        actions.push("drop".into());
    }
    format!("{},actions={}", words.join(","), actions.join(","))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_written_rule_reads_back_the_same() {
        for line in [
            "table=0,priority=200,tcp,nw_dst=198.19.0.0/16,tp_dst=80,actions=mod_dl_dst:02:00:00:00:0b:01,output:1",
            "table=1,priority=5,cookie=0x2a,idle_timeout=9,in_port=3,dl_src=02:00:00:00:00:01/ff:ff:ff:00:00:00,dl_vlan=7,udp6,ipv6_src=2001:db8::/32,tp_src=1000-2000,actions=strip_vlan,dec_ttl,controller",
            "priority=1,tcp,tcp_flags=0x02/0x12,actions=mod_nw_src:198.18.0.1,mod_tp_src:999,mod_vlan_vid:5,goto_table:2",
            "actions=drop",
        ] {
            let rule = parse_rule(line).unwrap();
            let text = format_rule(&rule);
            assert_eq!(parse_rule(&text).unwrap(), rule, "{line} -> {text}");
        }
    }

    #[test]
    fn a_rule_reads_as_written() {
        let r = parse_rule(
            "table=1, priority=200, cookie=0x2a, tcp, nw_dst=198.19.0.0/16, tp_dst=1024-2048, \
             dl_src=02:00:00:00:00:00/ff:ff:ff:00:00:00, tcp_flags=0x02/0x12, \
             actions=mod_dl_dst:02:00:00:00:0b:01,dec_ttl,output:3",
        )
        .unwrap();
        assert_eq!((r.table, r.priority, r.cookie), (1, 200, 42));
        assert_eq!(r.pattern.tp_dst, (1024, 2048));
        assert_eq!(r.pattern.value.ip_proto, 6);
        assert_eq!(r.pattern.mask.ip_dst, u128::MAX << 16);
        assert_eq!(r.pattern.value.ip_dst, mapped(0xc613_0000));
        assert_eq!(r.pattern.mask.eth_src, 0xffff_ff00_0000);
        assert_eq!(
            r.actions,
            [
                Action::Set(SetField::EthDst(0x0200_0000_0b01)),
                Action::DecTtl,
                Action::Output(3)
            ]
        );
        let packet = Fields {
            eth_src: 0x0200_0011_2233,
            eth_type: 0x0800,
            ip_proto: 6,
            ip_dst: mapped(0xc613_0505),
            tp_dst: 1500,
            tcp_flags: 0x02,
            ..Fields::default()
        };
        assert!(r.pattern.matches(&packet));
        let ack = Fields {
            tcp_flags: 0x12,
            ..packet
        };
        assert!(!r.pattern.matches(&ack), "SYN+ACK is not SYN alone");
    }

    #[test]
    fn mistakes_name_the_word() {
        let err = |l: &str| parse_rule(l).unwrap_err();
        assert_eq!(
            err("ip,nw_dst=198.19.0.0/33,actions=drop").word,
            "nw_dst=198.19.0.0/33"
        );
        assert!(
            err("ip,nw_dts=1.2.3.4,actions=drop")
                .problem
                .contains("not a match field")
        );
        assert!(
            err("ip,actions=output:1,jump:2")
                .problem
                .contains("not an action")
        );
        assert!(
            err("ip,tp_dst=90-80,actions=drop")
                .problem
                .contains("empty")
        );
        assert!(err("table=0,ip").problem.contains("actions="));
        assert!(
            err("actions=goto_table:1,output:2")
                .problem
                .contains("comes last")
        );
    }

    #[test]
    fn values_past_their_field_are_refused_with_the_range() {
        let err = |l: &str| parse_rule(l).unwrap_err().to_string();
        assert_eq!(
            err("dl_vlan=5000,actions=drop"),
            "'dl_vlan=5000': 5000 is not a VLAN id (0 to 4095)"
        );
        assert_eq!(
            err("ip,actions=mod_vlan_vid:9999,output:1"),
            "'mod_vlan_vid:9999': 9999 is not a VLAN id (0 to 4095)"
        );
        let top = parse_rule("dl_vlan=4095,actions=mod_vlan_vid:4095").unwrap();
        assert_eq!(top.pattern.value.vlan, 4095);
        assert_eq!(top.actions, [Action::PushVlan(4095)]);
        assert!(err("priority=65536,actions=drop").contains("too large"));
    }

    #[test]
    fn a_field_given_twice_or_two_words_that_disagree_are_refused() {
        let err = |l: &str| parse_rule(l).unwrap_err().to_string();
        assert_eq!(
            err("tcp,tp_dst=80,tp_dst=81,actions=drop"),
            "'tp_dst=81': the tp_dst is already given by 'tp_dst=80'; give it once"
        );
        assert!(err("tp_dst=80,tp_dst=80,actions=drop").contains("give it once"));
        assert!(err("tcp,nw_proto=17,actions=drop").contains("already given by 'tcp'"));
        assert!(err("ip,ipv6,actions=drop").contains("already given by 'ip'"));
        assert!(err("priority=1,priority=2,actions=drop").contains("give it once"));
        assert!(
            err("nw_dst=198.19.0.0/16,ipv6_dst=2001:db8::/32,actions=drop")
                .contains("destination address is already given")
        );
        // Words that agree on a field are one match, as ovs-ofctl reads them.
        let agreeing = parse_rule("ip,tcp,nw_proto=6,dl_type=0x0800,actions=drop").unwrap();
        assert_eq!(agreeing, parse_rule("tcp,actions=drop").unwrap());
    }

    #[test]
    fn a_prefix_of_the_other_family_is_refused() {
        let err = |l: &str| parse_rule(l).unwrap_err().to_string();
        assert_eq!(
            err("ipv6,nw_dst=198.19.0.0/16,actions=drop"),
            "'nw_dst=198.19.0.0/16': an IPv4 prefix in a rule that matches IPv6 packets \
             never matches; use ipv6_dst, or match IPv4"
        );
        assert!(err("udp,ipv6_src=2001:db8::/32,actions=drop").contains("use nw_src"));
        assert!(err("nw_src=198.18.0.1,tcp6,actions=drop").contains("IPv4 prefix"));
        parse_rule("ipv6,ipv6_dst=2001:db8::/32,actions=drop").unwrap();
        parse_rule("ip,nw_dst=198.19.0.0/16,actions=drop").unwrap();
    }

    #[test]
    fn an_empty_action_list_or_drop_among_actions_is_refused() {
        let err = |l: &str| parse_rule(l).unwrap_err().to_string();
        assert!(err("ip,actions=").contains("say actions=drop"));
        assert!(err("ip,actions= , ").contains("the action list is empty"));
        assert!(err("ip,actions=drop,output:1").contains("drop stands alone"));
        assert!(err("ip,actions=output:1,drop").contains("drop stands alone"));
        assert!(parse_rule("ip,actions=drop").unwrap().actions.is_empty());
    }

    #[test]
    fn a_mask_of_zero_is_read_with_a_warning() {
        let warned = |l: &str| {
            let (_, warnings) = parse_rule_warning(l).unwrap();
            warnings.iter().map(|w| w.word.clone()).collect::<Vec<_>>()
        };
        assert_eq!(
            warned(
                "ip,nw_dst=0.0.0.0/0,dl_src=02:00:00:00:00:01/00:00:00:00:00:00,\
                 tcp_flags=0x02/0x00,tp_dst=0-65535,actions=drop"
            ),
            [
                "nw_dst=0.0.0.0/0",
                "dl_src=02:00:00:00:00:01/00:00:00:00:00:00",
                "tcp_flags=0x02/0x00",
                "tp_dst=0-65535"
            ]
        );
        assert!(warned("ipv6,ipv6_src=::/0,actions=drop")[0].starts_with("ipv6_src"));
        let (_, warnings) = parse_rule_warning("ip,nw_dst=0.0.0.0/0,actions=drop").unwrap();
        assert!(warnings[0].problem.contains("matches every packet"));
        assert!(warned("ip,nw_dst=198.19.0.0/16,tp_dst=1-65535,actions=drop").is_empty());
    }
}
