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

/// Reads one rule. See the module documentation for the words.
pub fn parse_rule(line: &str) -> Result<Rule, RuleParseError> {
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
    for word in head.split([',', ' ', '\t']).filter(|w| !w.is_empty()) {
        let (key, text) = word.split_once('=').unwrap_or((word, ""));
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
                v.vlan = int(word, text)?;
                m.vlan = 0x0fff;
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
    }
    rule.pattern = rule.pattern.normalized();
    for word in actions.split([',', ' ', '\t']).filter(|w| !w.is_empty()) {
        let (name, arg) = word.split_once(':').unwrap_or((word, ""));
        let action = match name {
            "drop" => continue,
            "output" => Action::Output(int(word, arg)?),
            "controller" => Action::Controller,
            "dec_ttl" => Action::DecTtl,
            "strip_vlan" | "pop_vlan" => Action::PopVlan,
            "mod_vlan_vid" | "push_vlan" => Action::PushVlan(int(word, arg)?),
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
    Ok(rule)
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
}
