//! Flow records as text for people and scripts: CSV (one header line) and JSON lines.
//! Both come from one list of named columns, chosen by the run's [`Features`].

use crate::flow_stats::{Fate, FlowStats};
use crate::ipfix::Features;
use crate::record::FlowRecord;
use std::fmt::Write;

/// A column's value: numbers and addresses print bare in JSON, text quoted.
enum Value {
    Num(u64),
    Text(String),
    Missing,
}

/// TCP flags as letters, nfdump style: `UAPRSF`, a dot for each flag not seen.
pub fn tcp_flags(flags: u8) -> String {
    "UAPRSF"
        .chars()
        .enumerate()
        .map(|(i, c)| if flags & (0x20 >> i) != 0 { c } else { '.' })
        .collect()
}

fn direction(prefix: &str, f: Features, s: Option<&FlowStats>, cols: &mut Vec<(String, Value)>) {
    let mut col = |name: &str, v: Option<Value>| {
        cols.push((format!("{prefix}{name}"), v.unwrap_or(Value::Missing)))
    };
    if f.has(Features::COUNTS) {
        col("packets", s.map(|s| Value::Num(s.packets)));
        col("bytes", s.map(|s| Value::Num(s.bytes)));
    }
    if f.has(Features::TIMES) {
        col("start_ms", s.map(|s| Value::Num(s.first_ns / 1_000_000)));
        col("end_ms", s.map(|s| Value::Num(s.last_ns / 1_000_000)));
    }
    if f.has(Features::TCP_FLAGS) {
        col("tcp_flags", s.map(|s| Value::Text(tcp_flags(s.tcp_flags))));
    }
    if f.has(Features::TOS) {
        col("tos", s.map(|s| Value::Num(s.tos.into())));
    }
    if f.has(Features::TTL) {
        col("ttl_min", s.map(|s| Value::Num(s.ttl_min.into())));
        col("ttl_max", s.map(|s| Value::Num(s.ttl_max.into())));
    }
    if f.has(Features::SIZES) {
        col("len_min", s.map(|s| Value::Num(s.len_min.into())));
        col("len_max", s.map(|s| Value::Num(s.len_max.into())));
        col("len_mean", s.map(|s| Value::Num(s.len_mean())));
    }
    if f.has(Features::IAT) {
        col("iat_min_ns", s.and_then(|s| s.iat_min()).map(Value::Num));
        col(
            "iat_max_ns",
            s.and_then(|s| s.iat_min().map(|_| Value::Num(s.iat_max_ns))),
        );
        col(
            "iat_mean_ns",
            s.and_then(|s| s.iat_mean_ns()).map(Value::Num),
        );
    }
}

/// The columns of `r`; `drop_names` names the program's drop reasons (`DropReason::name`).
fn columns(
    r: &FlowRecord,
    f: Features,
    biflow: bool,
    drop_names: &[&'static str],
) -> Vec<(String, Value)> {
    let k = &r.key;
    let ip = |a: Option<std::net::IpAddr>| a.map_or(Value::Missing, |a| Value::Text(a.to_string()));
    let icmp = matches!(k.proto, 1 | 58);
    let mut cols = vec![
        ("src".to_string(), ip(k.src_ip())),
        ("dst".to_string(), ip(k.dst_ip())),
        (
            "src_port".to_string(),
            Value::Num(if icmp { 0 } else { k.src_port.into() }),
        ),
        (
            "dst_port".to_string(),
            Value::Num(if icmp { 0 } else { k.dst_port.into() }),
        ),
        ("proto".to_string(), Value::Num(k.proto.into())),
    ];
    direction("", f, Some(&r.forward), &mut cols);
    let port = |p: u16| {
        Fate::of(p)
            .port()
            .map_or(Value::Missing, |p| Value::Num(p.into()))
    };
    if f.has(Features::PORTS) {
        cols.push(("in_port".into(), port(r.forward.in_port)));
        cols.push(("out_port".into(), port(r.forward.out_port)));
    }
    if f.has(Features::VLAN) {
        cols.push(("vlan".into(), Value::Num(k.vlan.into())));
    }
    if f.has(Features::ICMP) {
        let (t, c) = if icmp {
            (
                Value::Num((k.dst_port >> 8).into()),
                Value::Num((k.dst_port & 0xff).into()),
            )
        } else {
            (Value::Missing, Value::Missing)
        };
        cols.push(("icmp_type".into(), t));
        cols.push(("icmp_code".into(), c));
    }
    if f.has(Features::END_REASON) {
        cols.push(("end_reason".into(), Value::Text(r.end.name().into())));
    }
    if f.has(Features::FORWARDING) {
        let fate = Fate::of(r.forward.out_port);
        let text = |t: Option<&str>| t.map_or(Value::Missing, |t| Value::Text(t.into()));
        let reason = match fate {
            Fate::Dropped(code) => Some(stateplane_runtime::DropReason(code).name(drop_names)),
            _ => None,
        };
        cols.push(("forwarding".into(), text(fate.name())));
        cols.push(("drop_reason".into(), text(reason)));
    }
    if biflow {
        direction("rev_", f, r.reverse.as_ref(), &mut cols);
    }
    cols
}

/// The CSV header line for records of this shape (no newline).
pub fn csv_header(f: Features, biflow: bool) -> String {
    let any = FlowRecord {
        key: stateplane_wire::FlowKey::EMPTY,
        forward: crate::flow_stats::FlowStats::start(&Default::default()),
        reverse: None,
        end: crate::record::EndReason::Forced,
    };
    columns(&any, f, biflow, &[])
        .into_iter()
        .map(|(n, _)| n)
        .collect::<Vec<_>>()
        .join(",")
}

/// Appends one CSV line (with its newline) to `out`; `drop_names` as [`columns`].
pub fn csv_line(
    r: &FlowRecord,
    f: Features,
    biflow: bool,
    drop_names: &[&'static str],
    out: &mut String,
) {
    for (i, (_, v)) in columns(r, f, biflow, drop_names).into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = match v {
            Value::Num(n) => write!(out, "{n}"),
            Value::Text(t) => write!(out, "{t}"),
            Value::Missing => Ok(()),
        };
    }
    out.push('\n');
}

/// Appends one JSON object (with its newline) to `out`; missing values are left out;
/// `drop_names` as [`columns`].
pub fn json_line(
    r: &FlowRecord,
    f: Features,
    biflow: bool,
    drop_names: &[&'static str],
    out: &mut String,
) {
    out.push('{');
    let mut first = true;
    for (name, v) in columns(r, f, biflow, drop_names) {
        let sep = if first { "" } else { "," };
        let _ = match v {
            Value::Num(n) => write!(out, "{sep}\"{name}\":{n}"),
            // Values are addresses, flag letters and reason names: nothing to escape.
            Value::Text(t) => write!(out, "{sep}\"{name}\":\"{t}\""),
            Value::Missing => continue,
        };
        first = false;
    }
    out.push_str("}\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow_stats::Observation;
    use crate::record::EndReason;
    use std::net::Ipv4Addr;

    #[test]
    fn csv_and_json_name_the_same_columns() {
        let key = stateplane_wire::FlowKey::v4(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 2),
            6,
            1000,
            443,
        );
        let mut s = FlowStats::start(&Observation {
            ts_ns: 5_000_000,
            ip_len: 60,
            tcp_flags: 0x02,
            ..Default::default()
        });
        s.add(&Observation {
            ts_ns: 7_000_000,
            ip_len: 40,
            tcp_flags: 0x11,
            ..Default::default()
        });
        let r = FlowRecord {
            key,
            forward: s,
            reverse: None,
            end: EndReason::EndOfFlow,
        };
        let header = csv_header(Features::ALL, false);
        let mut line = String::new();
        csv_line(&r, Features::ALL, false, &[], &mut line);
        assert_eq!(
            header.split(',').count(),
            line.trim_end().split(',').count()
        );
        assert!(
            line.starts_with("198.18.0.1,198.18.0.2,1000,443,6,2,100,5,7,.A..SF"),
            "{line}"
        );
        let mut json = String::new();
        json_line(&r, Features::ALL, false, &[], &mut json);
        assert!(
            json.contains("\"bytes\":100") && json.contains("\"end_reason\":\"end_of_flow\""),
            "{json}"
        );
        assert!(json.contains("\"iat_mean_ns\":2000000"), "{json}");
        assert_eq!(tcp_flags(0x3f), "UAPRSF");
    }
}
