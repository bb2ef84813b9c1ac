//! ClassBench's text formats, written from our rules and packets, so that another
//! classifier (DPDK's `dpdk-test-acl`, which reads them) runs the same rules over the same
//! keys and its every verdict can be checked against ours (scripts/compare-dpdk.sh).
//!
//! A rule line: `@src/len dst/len sport_lo : sport_hi dport_lo : dport_hi proto/mask`,
//! earlier lines winning; a trace line: `src dst sport dport proto`, addresses as 32-bit
//! numbers. Only IPv4 5-tuple rules fit: a rule reading any other field is refused, naming
//! it, rather than written as something it is not.
//!
//! Must never: write a rule that matches other packets than ours does.

use stateplane_classifier::{Fields, Rule, format_rule};

/// The IPv4 prefix of a mapped address under `mask` (`::ffff:a.b.c.d/96+n`), as
/// `a.b.c.d/n`; none for a mask that is not such a prefix.
fn ipv4_prefix(value: u128, mask: u128) -> Option<String> {
    if mask == 0 {
        return Some("0.0.0.0/0".into());
    }
    let len = mask.leading_ones();
    let is_prefix = mask.checked_shl(len).is_none_or(|rest| rest == 0);
    let mapped = value >> 32 == 0xffff;
    (is_prefix && len >= 96 && mapped).then(|| {
        let addr = std::net::Ipv4Addr::from(value as u32);
        format!("{addr}/{}", len - 96)
    })
}

/// `rule` as a ClassBench rule line, or what keeps it from being one.
pub fn rule_line(rule: &Rule) -> Result<String, String> {
    let (m, v) = (&rule.pattern.mask, &rule.pattern.value);
    let refuse = |why: &str| Err(format!("`{}`: {why}", format_rule(rule)));
    if rule.table != 0 || rule.goto.is_some() {
        return refuse("a ClassBench rule has no tables: give one table's rules");
    }
    let others = Fields {
        ip_src: 0,
        ip_dst: 0,
        ip_proto: 0,
        eth_type: 0,
        ..*m
    };
    if others != Fields::default() {
        return refuse("it reads a field a ClassBench rule has not (only the IPv4 5-tuple)");
    }
    if m.eth_type != 0 && v.eth_type != 0x0800 {
        return refuse("a ClassBench rule matches IPv4 only");
    }
    let (Some(src), Some(dst)) = (
        ipv4_prefix(v.ip_src, m.ip_src),
        ipv4_prefix(v.ip_dst, m.ip_dst),
    ) else {
        return refuse("its addresses are not IPv4 prefixes");
    };
    let p = &rule.pattern;
    Ok(format!(
        "@{src}\t{dst}\t{} : {}\t{} : {}\t0x{:02x}/0x{:02x}",
        p.tp_src.0, p.tp_src.1, p.tp_dst.0, p.tp_dst.1, v.ip_proto, m.ip_proto
    ))
}

/// A packet's fields as a ClassBench trace line; none for a packet that is not IPv4.
pub fn trace_line(f: &Fields) -> Option<String> {
    let ipv4 = |a: u128| (a >> 32 == 0xffff).then_some(a as u32);
    if f.eth_type != 0x0800 {
        return None;
    }
    Some(format!(
        "{}\t{}\t{}\t{}\t{}",
        ipv4(f.ip_src)?,
        ipv4(f.ip_dst)?,
        f.tp_src,
        f.tp_dst,
        f.ip_proto
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_classifier::parse_rule;

    fn line(text: &str) -> Result<String, String> {
        rule_line(&parse_rule(text).unwrap())
    }

    #[test]
    fn five_tuple_rules_are_written_and_others_refused_by_name() {
        assert_eq!(
            line(
                "priority=9,tcp,nw_src=198.18.0.0/15,nw_dst=198.19.1.2,tp_dst=80-443,actions=drop"
            ),
            Ok("@198.18.0.0/15\t198.19.1.2/32\t0 : 65535\t80 : 443\t0x06/0xff".into())
        );
        assert_eq!(
            line("priority=0,actions=output:1"),
            Ok("@0.0.0.0/0\t0.0.0.0/0\t0 : 65535\t0 : 65535\t0x00/0x00".into())
        );
        let refused = [
            (
                "priority=1,dl_dst=02:00:00:00:00:01,actions=drop",
                "reads a field",
            ),
            ("priority=1,in_port=1,ip,actions=drop", "reads a field"),
            ("priority=1,arp,actions=drop", "IPv4 only"),
            (
                "priority=1,ipv6,ipv6_dst=2001:db8::/32,actions=drop",
                "IPv4",
            ),
            ("priority=1,ip,actions=goto_table:1", "no tables"),
        ];
        for (text, why) in refused {
            let e = line(text).unwrap_err();
            assert!(e.contains(why) && e.starts_with('`'), "{text}: {e}");
        }
    }

    #[test]
    fn ipv4_packets_become_trace_lines_and_others_none() {
        let mut f = Fields {
            eth_type: 0x0800,
            ip_src: 0xffff_c612_0001,
            ip_dst: 0xffff_c613_ffff,
            ip_proto: 17,
            tp_src: 65535,
            tp_dst: 53,
            ..Fields::default()
        };
        assert_eq!(
            trace_line(&f).as_deref(),
            Some("3323068417\t3323199487\t65535\t53\t17")
        );
        f.eth_type = 0x86dd;
        assert_eq!(trace_line(&f), None);
    }
}
