//! The fuzz targets' bodies: one function per decoder of outside input, each taking
//! arbitrary bytes. A body must never panic, hang or allocate without bound whatever it is
//! given; where a decoder promises more (what is encoded reads back the same, what is
//! printed parses back), the body checks that too, and a broken promise is a crash.
//!
//! `fuzz_targets/NAME.rs` hands libFuzzer's inputs to `NAME` (`cargo +nightly fuzz run
//! --features libfuzzer NAME`); `tests/corpus.rs` runs the checked-in corpus and every
//! past crash (`corpus/NAME/`, `regressions/NAME/`) through the same bodies on stable.
//!
//! Must never: read or write files, open sockets, or keep state between calls.

use std::sync::OnceLock;

/// The names of the targets, as `fuzz_targets/` and `corpus/` name them.
pub const TARGETS: [&str; 12] = [
    "packet",
    "capture",
    "config",
    "rule_text",
    "control_request",
    "entry_text",
    "ipfix",
    "ipfix_round_trip",
    "sync_message",
    "replication_key",
    "store_reply",
    "program",
];

/// Runs target `name` on `data` (for the corpus runner).
pub fn run(name: &str, data: &[u8]) {
    match name {
        "packet" => packet(data),
        "capture" => capture(data),
        "config" => config(data),
        "rule_text" => rule_text(data),
        "control_request" => control_request(data),
        "entry_text" => entry_text(data),
        "ipfix" => ipfix(data),
        "ipfix_round_trip" => ipfix_round_trip(data),
        "sync_message" => sync_message(data),
        "replication_key" => replication_key(data),
        "store_reply" => store_reply(data),
        "program" => program(data),
        _ => panic!("no fuzz target {name}"),
    }
}

/// A frame through the one-pass parser (every header it knows: Ethernet, VLAN tags, ARP,
/// IPv4, IPv6 and its extension headers, TCP, UDP, ICMP, GTP-U), and the payload formats
/// programs read (the kv protocol, GTPv2-C).
pub fn packet(data: &[u8]) {
    static HASHER: OnceLock<stateplane_wire::FlowHasher> = OnceLock::new();
    let hasher = HASHER.get_or_init(|| stateplane_wire::FlowHasher::with_seed(7));
    if let Ok(parsed) = stateplane_wire::parse(data, 0, hasher) {
        // What the parser says lies inside the frame.
        assert!(usize::from(parsed.l3_offset) <= data.len());
        assert!(usize::from(parsed.l4_offset) <= data.len());
    }
    let _ = stateplane_wire::kv_proto::Message::parse(data);
    let _ = stateplane_wire::gtp::Gtpv2Repr::parse(data);
}

/// A capture file (pcap in either byte order and resolution, or pcapng), every record read.
pub fn capture(data: &[u8]) {
    let Ok(mut reader) = stateplane_io::CaptureReader::new(std::io::Cursor::new(data)) else {
        return;
    };
    // Each record takes at least a header's bytes of the input: the loop ends.
    while let Ok(Some(record)) = reader.next_record() {
        assert!(record.data.len() <= data.len());
    }
}

/// A run's configuration (TOML), and its program built from it under a small memory
/// budget, so that a size given in it is claimed and refused rather than allocated.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = stateplane_switch::config::RunConfig::parse(text, std::path::Path::new(""))
    else {
        return;
    };
    let Some(program) = &cfg.program else {
        return;
    };
    if program.name == "pipeline" && program.settings.contains_key("rules_file") {
        return; // reads a file: not this target's
    }
    let ports = stateplane_programs::PortNames(vec!["a".into(), "b".into(), "c".into()]);
    let budget = stateplane_mem::budget::Budget {
        limit: 64 << 20,
        copies: 1,
        setting: "memory_budget",
    };
    let settings = program.settings.get(&program.name).cloned();
    let _ = stateplane_mem::budget::scope(budget, || {
        stateplane_programs::build(&program.name, settings.as_ref(), &ports)
            .map(|factory| factory(0).declarations())
    });
}

/// A rule's text: read, then written and read again to the same rule.
pub fn rule_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok((rule, _)) = stateplane_classifier::parse_rule_warning(text) else {
        return;
    };
    let written = stateplane_classifier::format_rule(&rule);
    let again = stateplane_classifier::parse_rule(&written).unwrap_or_else(|e| {
        panic!("`{text}` was read and written as `{written}`, which is refused: {e}")
    });
    assert_eq!(again, rule, "`{text}` -> `{written}`");
}

/// The declarations requests are checked against: tables of every match kind.
fn declarations() -> &'static [stateplane_state::Declaration] {
    static DECLARATIONS: OnceLock<Vec<stateplane_state::Declaration>> = OnceLock::new();
    DECLARATIONS.get_or_init(|| {
        let ports = stateplane_programs::PortNames(vec!["a".into(), "b".into()]);
        let mut all = Vec::new();
        for program in ["l2", "router", "acl", "conntrack", "lb", "pipeline"] {
            if let Ok(factory) = stateplane_programs::build(program, None, &ports) {
                all.extend(factory(0).declarations());
            }
        }
        all
    })
}

/// A control API request as it comes off the wire (protobuf): a write's updates and a
/// flow request's change, converted and checked against the declarations as the server
/// does.
pub fn control_request(data: &[u8]) {
    use prost::Message;
    use stateplane_control::{convert, pb};
    if let Ok(write) = pb::WriteRequest::decode(data)
        && let Ok(decl) = stateplane_state::control::find(declarations(), &write.table)
    {
        let writes: Result<Vec<_>, _> = (write.updates.iter())
            .map(|u| convert::write_from_pb(u, decl))
            .collect();
        if let Ok(writes) = writes {
            let request = stateplane_state::Request::Write {
                table: write.table.clone(),
                writes,
            };
            let _ = decl.check(&request);
        }
    }
    if let Ok(flows) = pb::FlowsRequest::decode(data)
        && let Ok(change) = convert::flow_change_from_pb(flows.change.as_ref())
    {
        // What a client sends reads back as what it meant.
        if let Ok(pb_change) = convert::flow_change_to_pb(&change) {
            let back = convert::flow_change_from_pb(Some(&pb_change));
            assert_eq!(back.ok(), Some(change));
        }
    }
}

/// An entry as people type it (`ctl insert`), for each declared table: read, then printed
/// and read again to the same entry.
pub fn entry_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for decl in declarations() {
        let Ok(entry) = stateplane_control::entry_text::parse_entry(decl, text) else {
            continue;
        };
        let printed = stateplane_control::entry_text::print_entry(decl, &entry);
        let again = stateplane_control::entry_text::parse_entry(decl, &printed)
            .unwrap_or_else(|e| panic!("`{text}` printed as `{printed}` is refused: {e}"));
        assert_eq!(
            (&again.key, &again.action, &again.params),
            (&entry.key, &entry.action, &entry.params),
            "`{text}` -> `{printed}`"
        );
    }
}

/// IPFIX messages as a collector gets them (our decoder reads back what we export, and
/// is the model of what a collector must survive), one after another through one
/// decoder, so that templates from earlier messages are used.
pub fn ipfix(data: &[u8]) {
    let mut decoder = stateplane_flows::ipfix::Decoder::default();
    let mut rest = data;
    while rest.len() >= 4 {
        let len = usize::from(u16::from_be_bytes([rest[2], rest[3]])).clamp(4, rest.len());
        let _ = decoder.decode(&rest[..len]);
        rest = &rest[len..];
    }
}

/// Records made from the bytes, exported as IPFIX and as NetFlow v9 and read back: the
/// same records (the times at the millisecond the elements carry).
pub fn ipfix_round_trip(data: &[u8]) {
    use stateplane_flows::flow_stats::{FlowStats, Observation};
    use stateplane_flows::ipfix::{Decoder, Dialect, Encoder, Features, TemplateRefresh};
    use stateplane_flows::{EndReason, FlowRecord};
    let records: Vec<FlowRecord> = (data.chunks_exact(24))
        .map(|c| {
            let word = |at: usize| u32::from_be_bytes([c[at], c[at + 1], c[at + 2], c[at + 3]]);
            let half = |at: usize| u16::from_be_bytes([c[at], c[at + 1]]);
            let proto = if c[20] & 1 == 0 { 6 } else { 17 };
            let key = if c[20] & 2 == 0 {
                stateplane_wire::FlowKey::v4(
                    word(0).into(),
                    word(4).into(),
                    proto,
                    half(8),
                    half(10),
                )
            } else {
                let a = u128::from(word(0)) << 96 | u128::from(word(4));
                stateplane_wire::FlowKey::v6(a.into(), (!a).into(), proto, half(8), half(10))
            };
            // Up to 24.8 days before the export, as far back as NetFlow v9's uptime reaches.
            let o = Observation {
                ts_ns: (EXPORT_S * 1000 - u64::from(word(12) >> 1)) * 1_000_000,
                ip_len: u32::from(half(16).max(20)),
                ttl: c[18],
                tos: c[19],
                tcp_flags: c[21],
                in_port: u16::from(c[22]),
                out_port: u16::from(c[23]),
            };
            FlowRecord {
                key,
                forward: FlowStats::start(&o),
                reverse: None,
                end: EndReason::Idle,
            }
        })
        .collect();
    // NetFlow v9 carries all but the inter-arrival times.
    let v9_features = Features(Features::ALL.0 & !Features::IAT);
    for (dialect, features) in [
        (Dialect::Ipfix, Features::ALL),
        (Dialect::Netflow9, v9_features),
    ] {
        let mut encoder =
            Encoder::in_dialect(dialect, 1, features, false, 1400, TemplateRefresh::UDP);
        let mut messages = Vec::new();
        encoder.encode(&records, EXPORT_S as u32, &mut |m| {
            messages.push(m.to_vec())
        });
        encoder.finish(&mut |m| messages.push(m.to_vec()));
        let mut decoder = Decoder::default();
        let mut back = Vec::new();
        for m in &messages {
            let (_, got) = decoder.decode(m).unwrap_or_else(|e| panic!("{e:?}"));
            back.extend(got);
        }
        // Each message holds one family, in order within it.
        for v in [4, 6] {
            let sent = records.iter().filter(|r| r.key.ip_version == v);
            let got: Vec<_> = back.iter().filter(|r| r.key.ip_version == v).collect();
            assert_eq!(sent.clone().count(), got.len(), "{dialect:?}");
            for (a, b) in sent.zip(got) {
                assert_eq!(a.key, b.key, "{dialect:?}");
                let (x, y) = (&a.forward, &b.forward);
                assert_eq!(
                    (x.packets, x.bytes, x.first_ns, x.last_ns),
                    (y.packets, y.bytes, y.first_ns, y.last_ns),
                    "{dialect:?}"
                );
                assert_eq!(
                    (x.tcp_flags, x.tos, x.ttl_min),
                    (y.tcp_flags, y.tos, y.ttl_min),
                    "{dialect:?}"
                );
            }
        }
    }
}

/// When `ipfix_round_trip`'s records are exported, in seconds since the epoch.
const EXPORT_S: u64 = 1_700_000_000;

/// A sync message as a collector or a switch receives it: read, then written and read
/// again to the same message.
pub fn sync_message(data: &[u8]) {
    use stateplane_sync::wire::Message;
    let Ok(message) = Message::decode(data) else {
        return;
    };
    let mut written = Vec::new();
    message.encode(&mut written);
    assert_eq!(Message::decode(&written).ok(), Some(message));
}

/// A flow's key as a store keeps it (an alias's value): read, then written back the same.
pub fn replication_key(data: &[u8]) {
    use stateplane_replication::protocol::FlowBytes;
    let Some(key) = FlowBytes::decode(data) else {
        return;
    };
    let mut written = Vec::new();
    key.encode(&mut written);
    assert_eq!(FlowBytes::decode(&written), Some(key));
}

/// A Redis store's answer to a replication function, from its bytes on the wire (RESP):
/// read with every element checked, never trusted.
pub fn store_reply(data: &[u8]) {
    let _ = stateplane_stores::redis::reply_from_wire(7, data);
}

/// The catalog's programs that run on their defaults with two ports, built once (each
/// input gets a fresh copy from its factory: no state passes between inputs).
fn catalog() -> &'static [(&'static str, stateplane_runtime::ProgramFactory)] {
    static PROGRAMS: OnceLock<Vec<(&'static str, stateplane_runtime::ProgramFactory)>> =
        OnceLock::new();
    PROGRAMS.get_or_init(|| {
        let ports = stateplane_programs::PortNames(vec!["p0".into(), "p1".into()]);
        (stateplane_programs::catalog().into_iter())
            .filter_map(|(name, _)| {
                let factory = stateplane_programs::build(name, None, &ports).ok()?;
                Some((name, factory))
            })
            .collect()
    })
}

/// Frames through a program of the catalog on its defaults: the first byte picks the
/// program, the rest is frames, each a 2-byte length and its bytes (at most 64), arriving
/// on alternate ports in one burst, what parses handed to the program as a worker hands it;
/// then the same burst again 100 s later, so that timers and ageing run over what the first
/// left. Every verdict names a port that exists.
pub fn program(data: &[u8]) {
    use stateplane_runtime::{Burst, Context, Verdict};
    let Some((&pick, mut rest)) = data.split_first() else {
        return;
    };
    let programs = catalog();
    let Some((_, factory)) = programs.get(usize::from(pick) % programs.len().max(1)) else {
        return;
    };
    let mut frames = Vec::new();
    while let [hi, lo, tail @ ..] = rest
        && frames.len() < 64
    {
        let len = usize::from(u16::from_be_bytes([*hi, *lo])).min(tail.len());
        frames.push(&tail[..len]);
        rest = &tail[len..];
    }
    let hasher = stateplane_wire::FlowHasher::with_seed(7);
    let mut program = factory(0);
    for now_ns in [1, 100_000_000_001] {
        let mut burst = Burst::with_capacity(frames.len().max(1));
        for (i, f) in frames.iter().enumerate() {
            burst.push(f, f.len() as u32, now_ns, (i % 2) as u16, i as u64);
        }
        burst.parse(&hasher);
        // As the worker does: programs see only what parsed (malformed frames are dropped
        // and counted before them).
        burst.retain(|d| d.malformed.is_none());
        program.process(&mut burst, &mut Context::one_worker(now_ns, hasher, 2));
        for d in burst.descs() {
            if let Verdict::Forward(port) = d.verdict {
                assert!(usize::from(port) < 2, "a verdict to port {port} of 2");
            }
        }
    }
}
