//! Entries as people type and read them, by the table's declaration.
//!
//! An entry is `FIELD=MATCH ... ACTION [PARAM=VALUE ...] [priority=N]`, e.g.
//! `vlan=0 mac=02:00:00:00:00:0b forward port=1`. A match is written by the field's kind:
//! exact `VALUE`, lpm `VALUE/LEN`, ternary `VALUE&&&MASK`, range `LOW..HIGH`; a value by
//! the field's format: an integer (decimal or `0x` hex), a MAC, an IPv4 or IPv6 address.
//! Reads print entries the same way, with `hits=N` after them (ignored on input), so output
//! can be fed back.

use stateplane_state::control::{Field, Format, Kind, MatchKind, ip_addr, ip_value};
use stateplane_state::{Declaration, Entry, Match};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Parses one value of `field`, which must fit its width.
pub fn parse_value(field: &Field, text: &str) -> Result<u128, String> {
    let value = parse_unchecked(field, text)?;
    field.check_value(value).map_err(|e| e.to_string())?;
    Ok(value)
}

fn parse_unchecked(field: &Field, text: &str) -> Result<u128, String> {
    let bad = |what: &str| format!("`{}`: '{text}' is not {what}", field.name);
    match field.format {
        Format::Int => {
            let v = match text.strip_prefix("0x") {
                Some(hex) => u128::from_str_radix(hex, 16),
                None => text.parse::<u128>(),
            };
            v.map_err(|_| bad("an integer (decimal or 0x hex)"))
        }
        Format::Mac => {
            let mac: stateplane_wire::MacAddr = text.parse().map_err(|_| bad("a MAC address"))?;
            Ok(u128::from(mac.to_u64()))
        }
        Format::Ipv4 => text
            .parse::<Ipv4Addr>()
            .map(|a| u128::from(u32::from(a)))
            .map_err(|_| bad("an IPv4 address")),
        Format::Ipv6 => text
            .parse::<Ipv6Addr>()
            .map(u128::from)
            .map_err(|_| bad("an IPv6 address")),
        Format::Ip => text
            .parse::<IpAddr>()
            .map(ip_value)
            .map_err(|_| bad("an IP address")),
    }
}

pub fn print_value(field: &Field, v: u128) -> String {
    match field.format {
        Format::Int => v.to_string(),
        Format::Mac => {
            let b = v.to_be_bytes();
            b[10..]
                .iter()
                .map(|x| format!("{x:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        }
        Format::Ipv4 => Ipv4Addr::from(v as u32).to_string(),
        Format::Ipv6 => Ipv6Addr::from(v).to_string(),
        Format::Ip => ip_addr(v).to_string(),
    }
}

/// Parses one key field's match.
pub fn parse_match(field: &Field, text: &str) -> Result<Match, String> {
    let v = |t: &str| parse_value(field, t);
    match field.kind {
        MatchKind::Exact => Ok(Match::Exact(v(text)?)),
        MatchKind::Lpm => {
            let (value, len) = match text.split_once('/') {
                Some((a, l)) => (
                    a,
                    l.parse::<u8>()
                        .map_err(|_| format!("`{}`: '{l}' is not a prefix length", field.name))?,
                ),
                None => (text, field.bits),
            };
            Ok(Match::Prefix {
                value: v(value)?,
                len,
            })
        }
        MatchKind::Ternary => match text.split_once("&&&") {
            Some((value, mask)) => Ok(Match::Ternary {
                value: v(value)?,
                mask: v(mask)?,
            }),
            None if text == "*" => Ok(Match::Ternary { value: 0, mask: 0 }),
            None => Ok(Match::Ternary {
                value: v(text)?,
                mask: u128::MAX >> (128 - u32::from(field.bits)),
            }),
        },
        MatchKind::Range => match text.split_once("..") {
            Some((low, high)) => Ok(Match::Range {
                low: v(low)?,
                high: v(high)?,
            }),
            None => {
                let one = v(text)?;
                Ok(Match::Range {
                    low: one,
                    high: one,
                })
            }
        },
    }
}

pub fn print_match(field: &Field, m: &Match) -> String {
    let v = |x: u128| print_value(field, x);
    match *m {
        Match::Exact(x) => v(x),
        Match::Prefix { value, len } => format!("{}/{len}", v(value)),
        Match::Ternary { value, mask } => format!("{}&&&{}", v(value), v(mask)),
        Match::Range { low, high } => format!("{}..{}", v(low), v(high)),
    }
}

fn shape(d: &Declaration) -> Result<(&[Field], &[stateplane_state::control::Action]), String> {
    match &d.kind {
        Kind::Table { key, actions, .. } => Ok((key, actions)),
        Kind::Register { .. } | Kind::Meters | Kind::Rules { .. } => {
            Err(format!("`{}` is not a table", d.name))
        }
    }
}

/// Parses `FIELD=MATCH ...` words into a key (every field, in declaration order).
pub fn parse_key(d: &Declaration, words: &[&str]) -> Result<Vec<Match>, String> {
    let (fields, _) = shape(d)?;
    let mut key = vec![None; fields.len()];
    for w in words {
        let Some((name, text)) = w.split_once('=') else {
            return Err(format!("'{w}' is not FIELD=VALUE"));
        };
        let Some(i) = fields.iter().position(|f| f.name == name) else {
            return Err(format!(
                "table `{}` has no key field `{name}`; its key is: {}",
                d.name,
                field_names(fields)
            ));
        };
        key[i] = Some(parse_match(&fields[i], text)?);
    }
    key.into_iter()
        .zip(fields)
        .map(|(m, f)| m.ok_or_else(|| format!("the key needs `{}=...` too", f.name)))
        .collect()
}

fn field_names(fields: &[Field]) -> String {
    fields
        .iter()
        .map(|f| f.name.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Parses a whole entry: key words, then the action, then its parameters.
pub fn parse_entry(d: &Declaration, text: &str) -> Result<Entry, String> {
    parse_entry_keeping(d, text, None)
}

/// The key of an entry's text (the words before its action), or of a bare key.
pub fn parse_entry_key(d: &Declaration, text: &str) -> Result<Vec<Match>, String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let at = words.iter().position(|w| !w.contains('='));
    parse_key(d, at.map_or(&words[..], |at| &words[..at]))
}

/// As [`parse_entry`], with each parameter left out taken from `current` (the entry as
/// it is) when its action has one of that name: what `modify` on the command line does.
pub fn parse_entry_keeping(
    d: &Declaration,
    text: &str,
    current: Option<&Entry>,
) -> Result<Entry, String> {
    let (_, actions) = shape(d)?;
    let words: Vec<&str> = text.split_whitespace().collect();
    let Some(at) = words.iter().position(|w| !w.contains('=')) else {
        let names: Vec<&str> = actions.iter().map(|a| a.name.as_str()).collect();
        return Err(format!(
            "give an action after the key: one of {}",
            names.join(", ")
        ));
    };
    let key = parse_key(d, &words[..at])?;
    let name = words[at];
    let Some(action) = actions.iter().find(|a| a.name == name) else {
        let names: Vec<&str> = actions.iter().map(|a| a.name.as_str()).collect();
        return Err(format!(
            "table `{}` has no action `{name}`; its actions are: {}",
            d.name,
            names.join(", ")
        ));
    };
    let mut params = vec![None; action.params.len()];
    let mut priority = 0;
    for w in &words[at + 1..] {
        let Some((name, text)) = w.split_once('=') else {
            return Err(format!("'{w}' is not PARAM=VALUE"));
        };
        if name == "hits" {
            continue; // read back from `print_entry`: a counter, not something to set
        }
        if name == "priority" {
            priority = text
                .parse()
                .map_err(|_| format!("priority '{text}' is not a number"))?;
            continue;
        }
        let Some(i) = action.params.iter().position(|p| p.name == name) else {
            return Err(format!(
                "action `{}` has no parameter `{name}`; its parameters are: {}",
                action.name,
                field_names(&action.params)
            ));
        };
        params[i] = Some(parse_value(&action.params[i], text)?);
    }
    let kept = |name: &str| {
        let current = current?;
        let was = actions.iter().find(|a| a.name == current.action)?;
        let i = was.params.iter().position(|p| p.name == name)?;
        current.params.get(i).copied()
    };
    let params = params
        .into_iter()
        .zip(&action.params)
        .map(|(v, p)| {
            v.or_else(|| kept(&p.name))
                .ok_or_else(|| format!("action `{}` needs `{}=...`", action.name, p.name))
        })
        .collect::<Result<_, _>>()?;
    Ok(Entry {
        key,
        action: action.name.clone(),
        params,
        priority,
        hits: 0,
    })
}

/// A key in the form [`parse_key`] reads.
pub fn print_key(d: &Declaration, key: &[Match]) -> String {
    key_words(d, key).join(" ")
}

fn key_words(d: &Declaration, key: &[Match]) -> Vec<String> {
    let Ok((fields, _)) = shape(d) else {
        return Vec::new();
    };
    (fields.iter().zip(key))
        .map(|(f, m)| format!("{}={}", f.name, print_match(f, m)))
        .collect()
}

/// An entry in the form [`parse_entry`] reads, with its hit count.
pub fn print_entry(d: &Declaration, e: &Entry) -> String {
    let Ok((_, actions)) = shape(d) else {
        return String::new();
    };
    let mut words = key_words(d, &e.key);
    words.push(e.action.clone());
    if let Some(a) = actions.iter().find(|a| a.name == e.action) {
        for (p, &v) in a.params.iter().zip(&e.params) {
            words.push(format!("{}={}", p.name, print_value(p, v)));
        }
    }
    if e.priority != 0 {
        words.push(format!("priority={}", e.priority));
    }
    words.push(format!("hits={}", e.hits));
    words.join(" ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use stateplane_state::Guarantee;
    use stateplane_state::control::Action;

    fn table() -> Declaration {
        let f = Field::new;
        Declaration {
            name: "t".into(),
            capacity: 8,
            guarantees: vec![Guarantee::Local],
            kind: Kind::Table {
                key: vec![
                    f("mac", 48, Format::Mac, MatchKind::Exact),
                    f("dst", 32, Format::Ipv4, MatchKind::Lpm),
                    f("src", 128, Format::Ip, MatchKind::Ternary),
                    f("port", 16, Format::Int, MatchKind::Range),
                ],
                actions: vec![Action {
                    name: "send".into(),
                    params: vec![f("port", 16, Format::Int, MatchKind::Exact)],
                }],
                writable: true,
            },
        }
    }

    #[test]
    fn an_entry_prints_as_it_is_typed() {
        let d = table();
        let typed = "port=80..443 mac=02:00:00:00:00:0b dst=198.18.0.0/15 \
                     src=198.18.0.1&&&::ffff:255.255.255.0 send port=0x10 priority=7";
        let e = parse_entry(&d, typed).unwrap();
        assert_eq!(e.key[0], Match::Exact(0x0200_0000_000b));
        assert_eq!(
            e.key[1],
            Match::Prefix {
                value: 0xc612_0000,
                len: 15
            }
        );
        assert_eq!(e.key[3], Match::Range { low: 80, high: 443 });
        assert_eq!((e.params.as_slice(), e.priority), (&[16u128][..], 7));
        let printed = print_entry(&d, &e);
        assert_eq!(
            printed,
            "mac=02:00:00:00:00:0b dst=198.18.0.0/15 src=198.18.0.1&&&255.255.255.0 \
             port=80..443 send port=16 priority=7 hits=0"
        );
        let again = parse_entry(&d, &printed).unwrap();
        assert_eq!(again, e);
    }

    #[test]
    fn mistakes_name_the_field_and_the_fix() {
        let d = table();
        let err = |t: &str| parse_entry(&d, t).unwrap_err();
        assert!(err("mac=02:00:00:00:00:01 send port=1").contains("the key needs `dst=...`"));
        assert!(err("mac=zz dst=1.2.3.4 src=* port=1 send port=1").contains("not a MAC"));
        assert!(
            err("mac=02:00:00:00:00:01 dst=1.2.3.4 src=* port=1 drop")
                .contains("its actions are: send")
        );
        assert!(
            err("mac=02:00:00:00:00:01 dst=1.2.3.4 src=* port=1 send").contains("needs `port=...`")
        );
        assert!(err("vlan=3 send").contains("its key is: mac dst src port"));
    }

    #[test]
    fn a_modify_keeps_the_parameters_it_leaves_out() {
        let f = Field::new;
        let action = |name: &str| Action {
            name: name.into(),
            params: vec![
                f("weight", 16, Format::Int, MatchKind::Exact),
                f("mac", 48, Format::Mac, MatchKind::Exact),
            ],
        };
        let d = Declaration {
            name: "backends".into(),
            capacity: 4,
            guarantees: vec![Guarantee::Local],
            kind: Kind::Table {
                key: vec![f("address", 32, Format::Ipv4, MatchKind::Exact)],
                actions: vec![action("up"), action("down")],
                writable: true,
            },
        };
        let current =
            parse_entry(&d, "address=198.18.0.2 up weight=3 mac=02:00:00:00:00:02").unwrap();
        let down = parse_entry_keeping(&d, "address=198.18.0.2 down", Some(&current)).unwrap();
        assert_eq!(
            (down.action.as_str(), down.params),
            ("down", vec![3, 0x0200_0000_0002])
        );
        let heavier =
            parse_entry_keeping(&d, "address=198.18.0.2 up weight=5", Some(&current)).unwrap();
        assert_eq!(heavier.params, [5, 0x0200_0000_0002]);
        assert!(
            parse_entry(&d, "address=198.18.0.2 down")
                .unwrap_err()
                .contains("needs `weight=...`")
        );
        assert_eq!(
            parse_entry_key(&d, "address=198.18.0.2 up weight=3").unwrap(),
            parse_entry_key(&d, "address=198.18.0.2").unwrap()
        );
    }
}
