//! `acl`: a stateless 5-tuple access list (permit/deny, first match wins) in front of
//! forwarding or routing.
//!
//! Rules are read top down, as in a router's ACL: the first rule that matches decides;
//! nothing matching gets `default` (deny unless said otherwise). Permitted packets go on to
//! the next stage: a `router` given in `[program.acl.router]` (the `acl` before `router` of
//! a firewall-router), or else `forward`'s port map. Denied packets are dropped (`denied`).
//! IPv4 only; IPv6 and non-IP packets take `default`.
//!
//! State: a ternary table (read-centric; built whole from the rules). Configuration:
//! `rules = [{ action = "permit" | "deny", src = "198.18.0.0/16", dst = "any",
//! proto = "tcp" | "udp" | "icmp" | NUMBER | "any", src_ports = "any" | "80" | "1024-65535",
//! dst_ports = ... }]`, `default`, and `map` or `router`.

use crate::forward::{Forward, ForwardConfig};
use crate::router::{Router, RouterConfig};
use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, DropReason, Prepared, Program, Verdict};
use stateplane_state::ternary::{Packet5, Rule, Ternary};
use stateplane_state::{ControlError, Counters, Declaration, Guarantee, Kind, Reply, Request};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

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
}

/// The next stage for permitted packets.
#[derive(Clone)]
enum Next {
    Forward(Forward),
    Router(Router),
}

#[derive(Clone)]
pub struct Acl {
    table: Arc<Ternary<bool>>,
    permit_by_default: bool,
    next: Next,
    /// Per rule (by position; the last one counts packets no rule matched): packets and
    /// bytes (IP packets' frame lengths), per worker.
    counters: Counters,
}

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

/// The drop reason of denied packets: after the next stage's own reasons.
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
        let mut rules = Vec::with_capacity(cfg.rules.len());
        for (i, r) in cfg.rules.iter().enumerate() {
            let f = format!("{field}.rules[{i}]");
            let (src, src_len) = prefix(&format!("{f}.src"), &r.src)?;
            let (dst, dst_len) = prefix(&format!("{f}.dst"), &r.dst)?;
            rules.push(Rule {
                src,
                src_len,
                dst,
                dst_len,
                proto: proto(&format!("{f}.proto"), &r.proto)?,
                src_ports: ports(&format!("{f}.src_ports"), &r.src_ports)?,
                dst_ports: ports(&format!("{f}.dst_ports"), &r.dst_ports)?,
                // First match wins: earlier rules rank higher.
                priority: (cfg.rules.len() - i) as u32,
                action: permit(&format!("{f}.action"), &r.action)?,
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
        Ok(Acl {
            counters: Counters::new(rules.len() + 1),
            table: Arc::new(Ternary::build(&rules)),
            permit_by_default: permit(
                &format!("{field}.default"),
                cfg.default.as_deref().unwrap_or("deny"),
            )?,
            next,
        })
    }
}

impl Program for Acl {
    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        match &mut self.next {
            Next::Forward(f) => f.process(burst, ctx),
            Next::Router(r) => r.process(burst, ctx),
        }
        let deny = denied(&self.next);
        let default_rule = self.counters.len() - 1;
        for d in burst.descs_mut() {
            let k = &d.parsed.key;
            let permitted = if k.ip_version == 4 {
                let p = Packet5 {
                    src: u32::from_be_bytes([k.src[0], k.src[1], k.src[2], k.src[3]]),
                    dst: u32::from_be_bytes([k.dst[0], k.dst[1], k.dst[2], k.dst[3]]),
                    proto: k.proto,
                    src_port: k.src_port,
                    dst_port: k.dst_port,
                };
                let rule = self.table.classify(&p);
                // Rules rank by position: the first has the highest priority.
                let index = rule.map_or(default_rule, |r| default_rule - r.priority as usize);
                self.counters.count(index, d.len);
                rule.map_or(self.permit_by_default, |r| r.action)
            } else {
                self.permit_by_default
            };
            if !permitted {
                d.verdict = Verdict::Drop(deny);
            }
        }
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        match self.next {
            Next::Forward(_) => &["no_mapping", "denied"],
            Next::Router(_) => &["no_route", "ttl_expired", "denied"],
        }
    }

    fn declarations(&self) -> Vec<Declaration> {
        let mut d = vec![
            counter_declaration("rule_packets", self.counters.len() - 1),
            counter_declaration("rule_bytes", self.counters.len() - 1),
        ];
        if let Next::Router(r) = &self.next {
            d.extend(r.declarations());
        }
        d
    }

    fn prepare(&self, request: &Request) -> Result<Option<Prepared>, ControlError> {
        match &self.next {
            Next::Router(r) if request.target().starts_with("routes") => r.prepare(request),
            _ => Ok(None),
        }
    }

    fn control(
        &mut self,
        request: &Request,
        prepared: Option<&Prepared>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        match (request, &mut self.next) {
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
                        u128::from(if name == "rule_packets" {
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
                        if name == "rule_packets" {
                            c.packets = v;
                        } else {
                            c.bytes = v;
                        }
                    });
                }
                Ok(Reply::Done)
            }
            (_, Next::Router(r)) => r.control(request, prepared, ctx),
            _ => Err(ControlError::Unavailable),
        }
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

    /// The acl's reason names are its next stage's, then `denied`, at the index `denied()`
    /// uses: the two lists are written apart, so this keeps them together.
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
            assert_eq!(all.len(), next.len() + 1);
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
        ] {
            let cfg: AclConfig = toml::from_str(text).unwrap();
            let e = Acl::new(&cfg, &names, "program.acl").err().unwrap();
            assert_eq!(e.field, field);
        }
    }
}
