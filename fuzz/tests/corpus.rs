//! Every target's checked-in corpus and past crashes through the fuzz bodies, on stable:
//! what `cargo fuzz` found once stays found. `write_seeds` (ignored; run it with
//! `--ignored`) writes the seed corpus from the project's own encoders and examples; the
//! same writer runs in every suite into a scratch directory, compared with the corpus.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

fn dir(kind: &str, target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(kind)
        .join(target)
}

fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir(kind, target)) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

#[test]
fn every_target_runs_its_corpus_and_past_crashes() {
    for target in stateplane_fuzz::TARGETS {
        let corpus = inputs("corpus", target);
        assert!(
            corpus.len() >= 3,
            "corpus/{target} holds {} inputs: write the seeds (cargo test -p \
             stateplane-fuzz --test corpus -- --ignored write_seeds)",
            corpus.len()
        );
        for file in corpus.iter().chain(&inputs("regressions", target)) {
            let data = std::fs::read(file).unwrap();
            eprintln!("{target}: {}", file.display());
            stateplane_fuzz::run(target, &data);
        }
    }
}

/// Writes every seed as `root/TARGET/NAME`, returning the files written.
fn write_seeds_into(root: &Path) -> Vec<PathBuf> {
    let mut written = Vec::new();
    seeds(|target, name, data| {
        let d = root.join(target);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(name), data).unwrap();
        written.push(Path::new(target).join(name));
    });
    written
}

/// Writes the seed corpus into `fuzz/corpus/`: run by name after an encoder, the generator
/// or an example changes (`every_seed_is_in_the_checked_in_corpus`, which runs the same
/// writer into a directory of its own in every suite run, then fails until it is).
#[test]
#[ignore = "writes into the checked-in fuzz/corpus; run by name (docs/HARDENING.md); its writer runs in every suite through every_seed_is_in_the_checked_in_corpus"]
fn write_seeds() {
    write_seeds_into(&Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"));
}

/// The checked-in corpus holds every seed as the project's encoders make it today: the
/// seeds are written as `write_seeds` writes them, into a directory of this test's own,
/// and each file compared.
#[test]
fn every_seed_is_in_the_checked_in_corpus() {
    // Removed when dropped, also when the test fails.
    let scratch_dir = tempfile::tempdir().unwrap();
    let scratch = scratch_dir.path().join("seeds");
    let written = write_seeds_into(&scratch);
    assert!(written.len() > 20, "{} seeds written", written.len());
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for file in &written {
        let held = std::fs::read(corpus.join(file)).unwrap_or_default();
        assert!(
            held == std::fs::read(scratch.join(file)).unwrap(),
            "{} is missing or stale: run `cargo test -p stateplane-fuzz --test corpus -- \
             --ignored write_seeds`",
            corpus.join(file).display()
        );
    }
}

/// A seed corpus: valid inputs of every kind, from the project's own encoders, examples
/// and generator, so that fuzzing starts from what real inputs look like; each handed to
/// `write` as (target, name, bytes).
fn seeds(mut write: impl FnMut(&str, &str, &[u8])) {
    // Frames of every workload the generator knows, and the capture files they make.
    use stateplane_gen::{GenConfig, Workload};
    let mut program_frames: Vec<Vec<u8>> = Vec::new();
    for (i, workload) in [
        Workload::Internet,
        Workload::Kv,
        Workload::Gtp,
        Workload::Synflood,
    ]
    .into_iter()
    .enumerate()
    {
        let mut cfg = GenConfig::new(workload, 12);
        cfg.ipv6_share = 0.5;
        let mut frames = Vec::new();
        let keep = |ts, f: &[u8]| {
            frames.push((ts, f.to_vec()));
            Ok(())
        };
        stateplane_gen::generate(&cfg, keep, |_| {}).unwrap();
        for (j, (_, f)) in frames.iter().enumerate().step_by(3) {
            write("packet", &format!("{i}-{j}"), f);
        }
        program_frames.extend(frames.iter().take(4).map(|(_, f)| f.clone()));
        use stateplane_io::CaptureFormat;
        for format in [
            CaptureFormat::PcapMicro,
            CaptureFormat::PcapNano,
            CaptureFormat::Pcapng,
        ] {
            let mut bytes = Vec::new();
            let mut w = stateplane_io::CaptureWriter::new(&mut bytes, format).unwrap();
            for (ts, f) in frames.iter().take(4) {
                w.write(*ts, f, f.len() as u32).unwrap();
            }
            w.flush().unwrap();
            write("capture", &format!("{i}-{format:?}"), &bytes);
            // The same records under each other link type read: their headers are taken
            // as that type's, and the rest as what follows it.
            if format == CaptureFormat::PcapMicro {
                for linktype in [0u32, 101, 108, 113, 228, 229, 276] {
                    bytes[20..24].copy_from_slice(&linktype.to_le_bytes());
                    write("capture", &format!("{i}-{format:?}-{linktype}"), &bytes);
                }
            }
        }
    }

    // Configurations: the examples, and one per program with its sizes given.
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for name in ["l2.toml", "chain.toml", "pipeline.toml"] {
        let text = std::fs::read_to_string(examples.join(name)).unwrap();
        // The pipeline example's rules file is read relative to it: not this target's.
        let text = text.replace("rules_file", "# rules_file");
        write("config", name, text.as_bytes());
    }
    for (program, settings) in [
        ("conntrack", "capacity = 1024"),
        ("counter", "capacity = 100000000"),
        ("hh", "width = 1024\ndepth = 4\ntenants = 2"),
        ("flowlet", "slots = 64"),
        ("nat", "capacity = 64"),
    ] {
        let text = format!(
            "workers = 2\n[program]\nname = \"{program}\"\n[program.{program}]\n{settings}\n"
        );
        write("config", &format!("{program}.toml"), text.as_bytes());
    }

    // Rule lines: the example file's, and the forms the format documents.
    let rules = std::fs::read_to_string(examples.join("pipeline.rules")).unwrap();
    let documented = [
        "table=1,priority=5,cookie=0x2a,idle_timeout=9,in_port=3,dl_src=02:00:00:00:00:01/ff:ff:ff:00:00:00,dl_vlan=7,udp6,ipv6_src=2001:db8::/32,tp_src=1000-2000,actions=strip_vlan,dec_ttl,controller",
        "priority=1,tcp,tcp_flags=0x02/0x12,actions=mod_nw_src:198.18.0.1,mod_tp_src:999,mod_vlan_vid:5,goto_table:2",
        "ip,nw_dst=0.0.0.0/0,actions=drop",
    ];
    for (i, line) in rules
        .lines()
        .filter(|l| l.contains("actions="))
        .chain(documented)
        .enumerate()
    {
        write("rule_text", &format!("{i}"), line.as_bytes());
    }

    // Entries as `ctl read` prints them, and the requests a client sends for them.
    let ports = stateplane_programs::PortNames(vec!["a".into(), "b".into()]);
    for (program, text) in [
        ("l2", "vlan=0 mac=02:00:00:00:01:02 forward port=1"),
        (
            "router",
            "dst=198.19.0.0/16 route port=1 mac=02:00:00:00:0b:01",
        ),
        (
            "acl",
            "src=0.0.0.0/0 dst=198.19.7.0/24 proto=17&&&255 src_port=0..65535 dst_port=53..53 permit priority=10",
        ),
    ] {
        write("entry_text", program, text.as_bytes());
        let factory = stateplane_programs::build(program, None, &ports).unwrap();
        let decls = factory(0).declarations();
        let decl = decls
            .iter()
            .find(|d| stateplane_control::entry_text::parse_entry(d, text).is_ok())
            .unwrap();
        let entry = stateplane_control::entry_text::parse_entry(decl, text).unwrap();
        use prost::Message;
        let request = stateplane_control::pb::WriteRequest {
            table: decl.name.clone(),
            updates: vec![stateplane_control::pb::Update {
                r#type: 0,
                entry: Some(stateplane_control::convert::entry_to_pb(&entry, decl)),
            }],
        };
        write("control_request", program, &request.encode_to_vec());
    }
    let add = stateplane_state::FlowChange::Add {
        lines: documented.iter().map(|l| l.to_string()).collect(),
        keep_counters: false,
    };
    let flows = stateplane_control::pb::FlowsRequest {
        name: "pipeline".into(),
        change: Some(stateplane_control::convert::flow_change_to_pb(&add).unwrap()),
    };
    write(
        "control_request",
        "flows",
        &prost::Message::encode_to_vec(&flows),
    );

    // IPFIX messages from the encoder, one file per message and one of a whole stream.
    use stateplane_flows::ipfix::{Encoder, Features, TemplateRefresh};
    let round_trip_input: Vec<u8> = (0..96u8).map(|i| i.wrapping_mul(37)).collect();
    write("ipfix_round_trip", "four", &round_trip_input);
    write("ipfix_round_trip", "one", &round_trip_input[..24]);
    write("ipfix_round_trip", "none", &[]);
    let mut encoder = Encoder::new(1, Features::ALL, true, 1400, TemplateRefresh::UDP);
    let records = ipfix_records();
    let mut messages = Vec::new();
    encoder.encode(&records, 1_700_000_000, &mut |m| messages.push(m.to_vec()));
    encoder.finish(&mut |m| messages.push(m.to_vec()));
    for (i, m) in messages.iter().enumerate() {
        write("ipfix", &format!("message-{i}"), m);
    }
    write("ipfix", "stream", &messages.concat());
    // NetFlow v9: each message a datagram (no length of its own).
    use stateplane_flows::ipfix::Dialect;
    let features = Features(Features::ALL.0 & !Features::IAT);
    let mut encoder = Encoder::in_dialect(
        Dialect::Netflow9,
        1,
        features,
        true,
        1400,
        TemplateRefresh::UDP,
    );
    let mut messages = Vec::new();
    encoder.encode(&records, 1_700_000_000, &mut |m| messages.push(m.to_vec()));
    encoder.finish(&mut |m| messages.push(m.to_vec()));
    for (i, m) in messages.iter().enumerate() {
        write("ipfix", &format!("netflow9-message-{i}"), m);
    }

    // Sync messages of every kind, and flow keys as a store keeps them.
    use stateplane_sync::wire::{Kind, Message};
    for (i, kind) in [Kind::Updates, Kind::Refresh, Kind::Heartbeat, Kind::Report]
        .into_iter()
        .enumerate()
    {
        let entries = match kind {
            // A refresh reads locations in order: runs, its zeros a run of no value bytes.
            Kind::Refresh => (0..40)
                .map(|n| stateplane_sync::Update {
                    location: stateplane_sync::Location { state: 0, index: n },
                    value: if (5..35).contains(&n) {
                        0
                    } else {
                        u64::from(n) << 40
                    },
                    threshold: 0,
                })
                .collect(),
            Kind::Updates => (0..5)
                .map(|n| stateplane_sync::Update {
                    location: stateplane_sync::Location {
                        state: 0,
                        index: n * 7,
                    },
                    value: u64::from(n) * 1000,
                    threshold: 4,
                })
                .collect(),
            _ => Vec::new(),
        };
        let message = Message {
            kind,
            switch: 1,
            epoch: 2,
            stream: 0,
            seq: 3,
            sent_ns: 1_700_000_000_000_000_000,
            t_max: 4,
            more: i == 0,
            entries,
        };
        let mut bytes = Vec::new();
        message.encode(&mut bytes);
        write("sync_message", &format!("{kind:?}"), &bytes);
    }
    // A write's part of a table's entries: one run in columns, a column of each width.
    let slots: Vec<u64> = (0..27u64)
        .map(|n| [1, 0, 0xffff_c612_0001, 80, 1 << 56, n][n as usize % 6])
        .collect();
    let stretch = stateplane_sync::wire::Stretch {
        first: stateplane_sync::Location { state: 2, index: 0 },
        threshold: 0,
        values: &slots,
        columns: 6,
    };
    let part = Message {
        kind: Kind::Write,
        switch: 1,
        epoch: 2,
        stream: 0,
        seq: 9,
        sent_ns: 1_700_000_000_000_000_000,
        t_max: 1,
        more: false,
        entries: Vec::new(),
    };
    let mut bytes = Vec::new();
    part.encode_carrying(&stretch, None, &mut bytes);
    write("sync_message", "WriteInColumns", &bytes);
    for (i, key) in [&[1u8, 2, 3][..], &[9; 40], &[]].into_iter().enumerate() {
        if let Some(k) = stateplane_replication::FlowBytes::new(key) {
            let mut bytes = Vec::new();
            k.encode(&mut bytes);
            write("replication_key", &format!("{i}"), &bytes);
        }
    }
    write("replication_key", "tagged", &[3, 1, 2, 3, 4, 5]);

    // A store's answers as they come over the wire (RESP): a grant, a write's, a refusal.
    for (name, reply) in [
        (
            "granted",
            &b"*7\r\n$1\r\nG\r\n$1\r\n3\r\n$20\r\n18446744073709551615\r\n$6\r\n100000\r\n$1\r\n9\r\n:1\r\n$2\r\nxy\r\n"[..],
        ),
        ("written", b"*4\r\n$1\r\nW\r\n$1\r\n3\r\n$1\r\n1\r\n$1\r\n1\r\n"),
        ("error", b"-ERR unknown command\r\n"),
        ("nil", b"$-1\r\n"),
    ] {
        write("store_reply", name, reply);
    }

    // Frames through every program: a pick, then frames each behind its length.
    for pick in 0..40u8 {
        let mut input = vec![pick];
        for f in program_frames.iter().skip(usize::from(pick) % 4).step_by(3) {
            input.extend_from_slice(&(f.len() as u16).to_be_bytes());
            input.extend_from_slice(f);
        }
        write("program", &format!("{pick}"), &input);
    }
}

fn ipfix_records() -> Vec<stateplane_flows::FlowRecord> {
    use stateplane_flows::flow_stats::{FlowStats, Observation};
    (0..6u16)
        .map(|i| {
            let o = Observation {
                ts_ns: 1_700_000_000_000_000_000 + u64::from(i) * 1_000_000,
                ip_len: 100 + u32::from(i),
                ttl: 64,
                tos: 0,
                tcp_flags: 0x12,
                in_port: 0,
                out_port: 1,
            };
            let key = if i % 2 == 0 {
                stateplane_wire::FlowKey::v4(
                    [198, 18, 0, 1].into(),
                    [198, 19, 0, 2].into(),
                    6,
                    1000 + i,
                    80,
                )
            } else {
                stateplane_wire::FlowKey::v6(
                    "2001:2::1".parse().unwrap(),
                    "2001:2::2".parse().unwrap(),
                    17,
                    2000 + i,
                    53,
                )
            };
            stateplane_flows::FlowRecord {
                key,
                forward: FlowStats::start(&o),
                reverse: (i % 3 == 0).then(|| FlowStats::start(&o)),
                end: stateplane_flows::EndReason::Idle,
            }
        })
        .collect()
}
