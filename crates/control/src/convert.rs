//! Between the protobuf messages and the state crate's control types.
//!
//! Values are fixed-length big-endian bytes of the declared width; a value of another
//! length is refused here with the field's name and the length it needs.

use crate::pb;
use stateplane_state::control::Fate;
use stateplane_state::control::{Action, Field, Format, Kind, MatchKind};
use stateplane_state::{Carried, ControlError, Declaration, Entry, Guarantee, Match, Notification};
use stateplane_state::{FlowChange, FlowFilter, FlowStat, MeterConfig, NotificationKind, Write};
use tonic::{Code, Status};

/// The bytes a field of `bits` takes.
pub fn width(bits: u8) -> usize {
    usize::from(bits).div_ceil(8)
}

pub fn to_bytes(value: u128, bits: u8) -> Vec<u8> {
    value.to_be_bytes()[16 - width(bits)..].to_vec()
}

pub fn from_bytes(bytes: &[u8], field: &Field) -> Result<u128, Status> {
    let want = width(field.bits);
    if bytes.len() != want {
        return Err(Status::invalid_argument(format!(
            "`{}` is {} bits wide: give {want} bytes, not {}",
            field.name,
            field.bits,
            bytes.len()
        )));
    }
    Ok(bytes.iter().fold(0u128, |v, &b| v << 8 | u128::from(b)))
}

/// The gRPC status of a refusal: the code says the cause, the message says what to do.
pub fn status(e: ControlError) -> Status {
    let code = match &e {
        ControlError::UnknownTable { .. }
        | ControlError::UnknownAction { .. }
        | ControlError::NoSuchEntry { .. } => Code::NotFound,
        ControlError::Arity { .. }
        | ControlError::Width { .. }
        | ControlError::MatchKind { .. } => Code::InvalidArgument,
        ControlError::ReadOnly { .. } => Code::FailedPrecondition,
        ControlError::TableFull { .. } | ControlError::OverBudget { .. } => Code::ResourceExhausted,
        ControlError::Exists { .. } => Code::AlreadyExists,
        ControlError::OutOfRange { .. } | ControlError::NoSuchPort { .. } => Code::OutOfRange,
        ControlError::Invalid { .. } => Code::InvalidArgument,
        ControlError::Unavailable => Code::Unavailable,
    };
    Status::new(code, e.to_string())
}

fn format_name(f: Format) -> &'static str {
    match f {
        Format::Int => "int",
        Format::Mac => "mac",
        Format::Ipv4 => "ipv4",
        Format::Ipv6 => "ipv6",
        Format::Ip => "ip",
    }
}

fn kind_name(k: MatchKind) -> &'static str {
    match k {
        MatchKind::Exact => "exact",
        MatchKind::Lpm => "lpm",
        MatchKind::Ternary => "ternary",
        MatchKind::Range => "range",
    }
}

fn field_to_pb(f: &Field) -> pb::Field {
    pb::Field {
        name: f.name.clone(),
        bits: u32::from(f.bits),
        format: format_name(f.format).to_string(),
        match_kind: kind_name(f.kind).to_string(),
    }
}

fn field_from_pb(f: &pb::Field) -> Result<Field, String> {
    let format = [
        Format::Int,
        Format::Mac,
        Format::Ipv4,
        Format::Ipv6,
        Format::Ip,
    ]
    .into_iter()
    .find(|&x| format_name(x) == f.format)
    .ok_or_else(|| format!("field `{}` has an unknown format `{}`", f.name, f.format))?;
    let kind = [
        MatchKind::Exact,
        MatchKind::Lpm,
        MatchKind::Ternary,
        MatchKind::Range,
    ]
    .into_iter()
    .find(|&x| kind_name(x) == f.match_kind)
    .ok_or_else(|| format!("field `{}` has an unknown match `{}`", f.name, f.match_kind))?;
    let bits = u8::try_from(f.bits)
        .ok()
        .filter(|b| (1..=128).contains(b))
        .ok_or_else(|| format!("field `{}` is {} bits wide", f.name, f.bits))?;
    // The switch checks a port field against its ports; the client needs only the form.
    Ok(Field::new(&f.name, bits, format, kind))
}

pub fn declaration_to_pb(d: &Declaration) -> pb::Declaration {
    let kind = match &d.kind {
        Kind::Table {
            key,
            actions,
            writable,
        } => pb::declaration::Kind::Table(pb::TableShape {
            key: key.iter().map(field_to_pb).collect(),
            actions: actions
                .iter()
                .map(|a| pb::Action {
                    name: a.name.clone(),
                    params: a.params.iter().map(field_to_pb).collect(),
                })
                .collect(),
            writable: *writable,
        }),
        Kind::Register { bits } => pb::declaration::Kind::Register(pb::RegisterShape {
            bits: u32::from(*bits),
        }),
        Kind::Meters => pb::declaration::Kind::Meters(pb::MeterShape {}),
        Kind::Rules { tables } => pb::declaration::Kind::Rules(pb::RulesShape {
            tables: u32::from(*tables),
        }),
    };
    pb::Declaration {
        name: d.name.clone(),
        capacity: d.capacity as u64,
        guarantees: d.guarantees.iter().map(|g| g.name().to_string()).collect(),
        kind: Some(kind),
    }
}

/// A declaration as a client reads it back.
pub fn declaration_from_pb(d: &pb::Declaration) -> Result<Declaration, String> {
    let kind = match &d.kind {
        Some(pb::declaration::Kind::Table(t)) => Kind::Table {
            key: t.key.iter().map(field_from_pb).collect::<Result<_, _>>()?,
            actions: t
                .actions
                .iter()
                .map(|a| {
                    Ok(Action {
                        name: a.name.clone(),
                        params: a
                            .params
                            .iter()
                            .map(field_from_pb)
                            .collect::<Result<_, _>>()?,
                    })
                })
                .collect::<Result<_, String>>()?,
            writable: t.writable,
        },
        Some(pb::declaration::Kind::Register(r)) => Kind::Register {
            bits: u8::try_from(r.bits).map_err(|_| format!("register {} bits", r.bits))?,
        },
        Some(pb::declaration::Kind::Meters(_)) => Kind::Meters,
        Some(pb::declaration::Kind::Rules(r)) => Kind::Rules {
            tables: u8::try_from(r.tables)
                .map_err(|_| format!("`{}` has {} tables", d.name, r.tables))?,
        },
        None => return Err(format!("`{}` declares no kind", d.name)),
    };
    let guarantees = d
        .guarantees
        .iter()
        .map(|g| {
            Guarantee::ALL
                .into_iter()
                .find(|x| x.name() == g)
                .ok_or_else(|| format!("`{}` has an unknown guarantee `{g}`", d.name))
        })
        .collect::<Result<_, _>>()?;
    Ok(Declaration {
        name: d.name.clone(),
        capacity: usize::try_from(d.capacity).unwrap_or(usize::MAX),
        guarantees,
        kind,
    })
}

pub fn key_to_pb(key: &[Match], fields: &[Field]) -> Vec<pb::Match> {
    use pb::r#match::Kind as K;
    key.iter()
        .zip(fields)
        .map(|(m, f)| {
            let b = |v: u128| to_bytes(v, f.bits);
            let kind = match *m {
                Match::Exact(v) => K::Exact(b(v)),
                Match::Prefix { value, len } => K::Prefix(pb::Prefix {
                    value: b(value),
                    len: u32::from(len),
                }),
                Match::Ternary { value, mask } => K::Ternary(pb::Ternary {
                    value: b(value),
                    mask: b(mask),
                }),
                Match::Range { low, high } => K::Range(pb::Range {
                    low: b(low),
                    high: b(high),
                }),
            };
            pb::Match { kind: Some(kind) }
        })
        .collect()
}

pub fn key_from_pb(key: &[pb::Match], fields: &[Field]) -> Result<Vec<Match>, Status> {
    use pb::r#match::Kind as K;
    if key.len() != fields.len() {
        return Err(status(ControlError::Arity {
            what: "the key".into(),
            expected: fields.len(),
            got: key.len(),
        }));
    }
    key.iter()
        .zip(fields)
        .map(|(m, f)| {
            let v = |b: &[u8]| from_bytes(b, f);
            Ok(match &m.kind {
                Some(K::Exact(b)) => Match::Exact(v(b)?),
                Some(K::Prefix(p)) => Match::Prefix {
                    value: v(&p.value)?,
                    len: u8::try_from(p.len).unwrap_or(u8::MAX),
                },
                Some(K::Ternary(t)) => Match::Ternary {
                    value: v(&t.value)?,
                    mask: v(&t.mask)?,
                },
                Some(K::Range(r)) => Match::Range {
                    low: v(&r.low)?,
                    high: v(&r.high)?,
                },
                None => {
                    return Err(Status::invalid_argument(format!(
                        "`{}` has no match",
                        f.name
                    )));
                }
            })
        })
        .collect()
}

/// The key fields and actions of a table declaration.
pub fn table_shape(d: &Declaration) -> Result<(&[Field], &[Action]), Status> {
    match &d.kind {
        Kind::Table { key, actions, .. } => Ok((key, actions)),
        Kind::Register { .. } | Kind::Meters | Kind::Rules { .. } => Err(Status::invalid_argument(
            format!("`{}` is not a table", d.name),
        )),
    }
}

pub fn entry_to_pb(e: &Entry, d: &Declaration) -> pb::Entry {
    let (key, actions) = table_shape(d).unwrap_or((&[], &[]));
    let params = actions
        .iter()
        .find(|a| a.name == e.action)
        .map_or(&[][..], |a| &a.params);
    pb::Entry {
        key: key_to_pb(&e.key, key),
        action: e.action.clone(),
        params: e
            .params
            .iter()
            .zip(params)
            .map(|(&v, f)| to_bytes(v, f.bits))
            .collect(),
        priority: e.priority,
        hits: e.hits,
    }
}

pub fn entry_from_pb(e: &pb::Entry, d: &Declaration) -> Result<Entry, Status> {
    let (key, actions) = table_shape(d)?;
    let params = match actions.iter().find(|a| a.name == e.action) {
        Some(a) if a.params.len() == e.params.len() => e
            .params
            .iter()
            .zip(&a.params)
            .map(|(b, f)| from_bytes(b, f))
            .collect::<Result<_, _>>()?,
        // The declaration check names the unknown action or the wrong count.
        _ => vec![0; e.params.len()],
    };
    Ok(Entry {
        key: key_from_pb(&e.key, key)?,
        action: e.action.clone(),
        params,
        priority: e.priority,
        hits: 0,
    })
}

pub fn write_from_pb(u: &pb::Update, d: &Declaration) -> Result<Write, Status> {
    let empty = pb::Entry::default();
    let e = u.entry.as_ref().unwrap_or(&empty);
    Ok(match pb::update::Type::try_from(u.r#type) {
        Ok(pb::update::Type::Insert) => Write::Insert(entry_from_pb(e, d)?),
        Ok(pb::update::Type::Modify) => Write::Modify(entry_from_pb(e, d)?),
        Ok(pb::update::Type::Delete) => Write::Delete(key_from_pb(&e.key, table_shape(d)?.0)?),
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "update type {} is not INSERT, MODIFY or DELETE",
                u.r#type
            )));
        }
    })
}

pub fn notification_to_pb(n: &Notification, d: Option<&Declaration>) -> pb::Notification {
    let (kind, deleted) = match n.kind {
        NotificationKind::IdleTimeout { deleted } => ("idle_timeout", deleted),
        NotificationKind::Digest => ("digest", false),
        NotificationKind::FlowRemoved { .. } => ("flow_removed", true),
    };
    let (flow, reason) = match &n.kind {
        NotificationKind::FlowRemoved { reason, flow } => (Some(flow_to_pb(flow)), reason.name()),
        _ => (None, ""),
    };
    pb::Notification {
        table: n.table.clone(),
        kind: kind.to_string(),
        deleted,
        entry: flow
            .is_none()
            .then(|| d.map(|d| entry_to_pb(&n.entry, d)))
            .flatten(),
        at_ns: n.at_ns,
        flow,
        reason: reason.to_string(),
    }
}

pub fn meter_to_pb(c: &MeterConfig) -> pb::MeterConfig {
    use pb::meter_config::Kind as K;
    let kind = match *c {
        MeterConfig::Off => None,
        MeterConfig::SrTcm { cir, cbs, ebs } => Some(K::Srtcm(pb::SrTcm { cir, cbs, ebs })),
        MeterConfig::TrTcm { cir, cbs, pir, pbs } => {
            Some(K::Trtcm(pb::TrTcm { cir, cbs, pir, pbs }))
        }
    };
    pb::MeterConfig { kind }
}

pub fn meter_from_pb(c: &pb::MeterConfig) -> MeterConfig {
    use pb::meter_config::Kind as K;
    match c.kind {
        None => MeterConfig::Off,
        Some(K::Srtcm(pb::SrTcm { cir, cbs, ebs })) => MeterConfig::SrTcm { cir, cbs, ebs },
        Some(K::Trtcm(pb::TrTcm { cir, cbs, pir, pbs })) => {
            MeterConfig::TrTcm { cir, cbs, pir, pbs }
        }
    }
}

fn table_from_pb(t: u32) -> Result<u8, Status> {
    u8::try_from(t).map_err(|_| Status::invalid_argument(format!("there is no table {t}")))
}

pub fn flow_filter_from_pb(f: Option<&pb::FlowFilter>) -> Result<FlowFilter, Status> {
    let Some(f) = f else {
        return Ok(FlowFilter::default());
    };
    let table = f.table.map(table_from_pb).transpose()?;
    Ok(FlowFilter {
        table,
        cookie: f.cookie,
        cookie_mask: f.cookie_mask,
    })
}

pub fn flow_filter_to_pb(f: &FlowFilter) -> pb::FlowFilter {
    pb::FlowFilter {
        table: f.table.map(u32::from),
        cookie: f.cookie,
        cookie_mask: f.cookie_mask,
    }
}

pub fn flow_change_from_pb(c: Option<&pb::flows_request::Change>) -> Result<FlowChange, Status> {
    use pb::flows_request::Change;
    Ok(match c {
        Some(Change::Add(lines)) => FlowChange::Add {
            lines: lines.rules.clone(),
            keep_counters: lines.keep_counters,
        },
        Some(Change::Modify(m)) => FlowChange::Modify {
            filter: flow_filter_from_pb(m.filter.as_ref())?,
            actions: m.actions.clone(),
        },
        Some(Change::Delete(f)) => FlowChange::Delete(flow_filter_from_pb(Some(f))?),
        Some(Change::Dump(f)) => FlowChange::Dump(flow_filter_from_pb(Some(f))?),
        Some(Change::Replace(r)) => FlowChange::Replace {
            table: r.table.map(table_from_pb).transpose()?,
            lines: r.rules.clone(),
        },
        None => return Err(Status::invalid_argument("a flows request needs a change")),
    })
}

/// A client's change as the API carries it; an expiry is the data plane's to ask for.
pub fn flow_change_to_pb(c: &FlowChange) -> Result<pb::flows_request::Change, Status> {
    use pb::flows_request::Change;
    Ok(match c {
        FlowChange::Add {
            lines,
            keep_counters,
        } => Change::Add(pb::FlowLines {
            rules: lines.clone(),
            keep_counters: *keep_counters,
        }),
        FlowChange::Modify { filter, actions } => Change::Modify(pb::FlowModify {
            filter: Some(flow_filter_to_pb(filter)),
            actions: actions.clone(),
        }),
        FlowChange::Delete(f) => Change::Delete(flow_filter_to_pb(f)),
        FlowChange::Dump(f) => Change::Dump(flow_filter_to_pb(f)),
        FlowChange::Replace { table, lines } => Change::Replace(pb::FlowReplace {
            table: table.map(u32::from),
            rules: lines.clone(),
        }),
        FlowChange::Expire(_) => {
            return Err(Status::invalid_argument(
                "rules expire by their timeouts; a client deletes them (del-flows)",
            ));
        }
    })
}

pub fn flow_to_pb(f: &FlowStat) -> pb::Flow {
    pb::Flow {
        id: f.id,
        table: u32::from(f.table),
        priority: u32::from(f.priority),
        cookie: f.cookie,
        rule: f.rule.clone(),
        packets: f.packets,
        bytes: f.bytes,
        duration_ns: f.duration_ns,
        idle_ns: f.idle_ns,
    }
}

pub fn carried_to_pb(c: &Carried) -> pb::Carried {
    let (fate, why) = match &c.fate {
        Fate::Whole => ("whole", ""),
        Fate::LeftBehind(why) => ("left_behind", why.as_str()),
        Fate::Afresh(why) => ("afresh", why.as_str()),
        Fate::Configured => ("configured", ""),
    };
    pb::Carried {
        name: c.name.clone(),
        kept: c.kept,
        dropped: c.dropped,
        fate: fate.to_string(),
        why: why.to_string(),
    }
}

pub fn carried_from_pb(c: &pb::Carried) -> Result<Carried, String> {
    let fate = match c.fate.as_str() {
        "whole" => Fate::Whole,
        "left_behind" => Fate::LeftBehind(c.why.clone()),
        "afresh" => Fate::Afresh(c.why.clone()),
        "configured" => Fate::Configured,
        other => return Err(format!("`{}`: unknown fate '{other}'", c.name)),
    };
    Ok(Carried {
        name: c.name.clone(),
        kept: c.kept,
        dropped: c.dropped,
        fate,
    })
}
