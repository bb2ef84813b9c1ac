//! The control plane end to end on the programs, without sockets: workers on threads run
//! bursts continuously (on a virtual clock the test moves) while the test submits requests.

use crate::testutil::hasher;
use crate::{PortNames, build};
use stateplane_runtime::{Burst, ControlPlane, Verdict, Worker};
use stateplane_state::{
    ControlError, Entry, Match, Notification, NotificationKind, Reply, Request, Write,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const WORKERS: usize = 2;
const SECOND: u64 = 1_000_000_000;

/// Per worker: bursts handled, and the verdict of the probe frame in the latest one.
struct Seen {
    bursts: AtomicU64,
    verdict: Mutex<Option<Verdict>>,
}

struct Switch {
    plane: Arc<ControlPlane>,
    stop: Arc<AtomicBool>,
    clock: Arc<AtomicU64>,
    /// The frame every burst carries.
    frame: Arc<Mutex<Vec<u8>>>,
    seen: Vec<Arc<Seen>>,
    threads: Vec<JoinHandle<()>>,
}

impl Switch {
    /// Starts `WORKERS` workers of `program` (configured by `config`) on ports a, b, c; each
    /// takes `frame` (until changed) in through port 0 in every burst.
    fn start(program: &str, config: &str, frame: Vec<u8>) -> Switch {
        Switch::start_within(program, config, frame, u64::MAX)
    }

    /// [`Switch::start`], the program built under a memory budget of `limit` bytes.
    fn start_within(program: &str, config: &str, frame: Vec<u8>, limit: u64) -> Switch {
        let table: toml::Value = toml::from_str(config).unwrap();
        let names = PortNames(vec!["a".into(), "b".into(), "c".into()]);
        let (factory, _) =
            stateplane_mem::budget::scope(budget(limit), || build(program, Some(&table), &names));
        let factory = factory.unwrap();
        let (plane, ends) = ControlPlane::new(WORKERS, factory(0));
        let stop = Arc::new(AtomicBool::new(false));
        let clock = Arc::new(AtomicU64::new(SECOND));
        let frame = Arc::new(Mutex::new(frame));
        let mut seen = Vec::new();
        let mut threads = Vec::new();
        for (w, end) in ends.into_iter().enumerate() {
            let s = Arc::new(Seen {
                bursts: AtomicU64::new(0),
                verdict: Mutex::new(None),
            });
            seen.push(s.clone());
            let mut worker = Worker::new(factory(w), w, WORKERS, 3, hasher()).with_control(end);
            let (stop, clock, frame) = (stop.clone(), clock.clone(), frame.clone());
            threads.push(std::thread::spawn(move || {
                let mut burst = Burst::with_capacity(4);
                while !stop.load(Ordering::Acquire) {
                    burst.clear();
                    let now = clock.load(Ordering::Acquire);
                    burst.now_ns = now;
                    let f = frame.lock().unwrap().clone();
                    burst.push(&f, f.len() as u32, now, 0, 0);
                    worker.handle(&mut burst);
                    *s.verdict.lock().unwrap() = burst.descs().first().map(|d| d.verdict);
                    s.bursts.fetch_add(1, Ordering::AcqRel);
                    std::thread::sleep(Duration::from_micros(200));
                }
            }));
        }
        Switch {
            plane,
            stop,
            clock,
            frame,
            seen,
            threads,
        }
    }

    /// The probe's verdict on every worker, from a burst each began after this call.
    fn verdicts(&self) -> Vec<Option<Verdict>> {
        let start: Vec<u64> = self
            .seen
            .iter()
            .map(|s| s.bursts.load(Ordering::Acquire))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        for (s, b) in self.seen.iter().zip(start) {
            while s.bursts.load(Ordering::Acquire) < b + 2 {
                assert!(Instant::now() < deadline, "a worker stopped taking bursts");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.seen
            .iter()
            .map(|s| *s.verdict.lock().unwrap())
            .collect()
    }

    fn read(&self, table: &str) -> Vec<Entry> {
        match self.plane.read(table, None).unwrap().reply {
            Reply::Entries(mut e) => {
                e.sort_by_key(|e| format!("{:?}", e.key));
                e
            }
            other => panic!("a read answered {other:?}"),
        }
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

const MAC_A: u128 = 0x0200_0000_000a;
const MAC_B: u128 = 0x0200_0000_000b;

/// A frame from 02:..:0a to 02:..:0b.
fn frame_to_b() -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 0x0b, 2, 0, 0, 0, 0, 0x0a, 0x88, 0xb5];
    f.resize(60, 0);
    f
}

fn station(mac: u128, port: u128) -> Entry {
    Entry {
        key: vec![Match::Exact(0), Match::Exact(mac)],
        action: "forward".into(),
        params: vec![port],
        priority: 0,
        hits: 0,
    }
}

fn write(table: &str, writes: Vec<Write>) -> Request {
    Request::Write {
        table: table.into(),
        writes,
    }
}

#[test]
fn an_acknowledged_insert_is_seen_by_every_worker_and_a_delete_undoes_it() {
    let sw = Switch::start("l2", "capacity = 8", frame_to_b());
    let unknown = Some(Verdict::Drop(stateplane_runtime::DropReason::program(0)));
    assert_eq!(sw.verdicts(), vec![unknown; WORKERS]);

    let done = sw
        .plane
        .submit(write("macs", vec![Write::Insert(station(MAC_B, 2))]))
        .unwrap();
    assert_eq!(done.version, 1);
    assert_eq!(
        sw.plane.version(),
        1,
        "every worker applied it before the reply"
    );
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(2)); WORKERS]);

    let moved = write("macs", vec![Write::Modify(station(MAC_B, 1))]);
    assert_eq!(sw.plane.submit(moved).unwrap().version, 2);
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(1)); WORKERS]);
    let entries = sw.read("macs");
    assert_eq!(
        entries.len(),
        1,
        "one entry, however many workers hold a copy"
    );
    assert_eq!(entries[0].params, [1]);
    assert!(entries[0].hits >= 4, "hits of both workers are summed");

    let gone = write("macs", vec![Write::Delete(station(MAC_B, 0).key)]);
    assert_eq!(
        sw.plane.submit(gone).unwrap().version,
        4,
        "the read took version 3"
    );
    assert_eq!(sw.verdicts(), vec![unknown; WORKERS]);
}

#[test]
fn a_refused_request_changes_nothing_and_says_why() {
    let sw = Switch::start(
        "l2",
        "capacity = 3\nmacs = [ { mac = \"02:00:00:00:00:01\", port = \"a\" } ]",
        frame_to_b(),
    );
    let before = sw.read("macs");
    let refused = |req: Request| sw.plane.submit(req).unwrap_err();

    assert!(matches!(
        refused(write("nope", vec![])),
        ControlError::UnknownTable { known, .. } if known == ["macs"]
    ));
    let too_wide = station(1 << 48, 1);
    assert!(matches!(
        refused(write("macs", vec![Write::Insert(too_wide)])),
        ControlError::Width { field, bits: 48 } if field == "mac"
    ));
    // The switch has ports a, b, c (0 to 2): a station on port 7 would black-hole.
    let nowhere = refused(write("macs", vec![Write::Insert(station(MAC_B, 7))]));
    assert_eq!(
        nowhere.to_string(),
        "`port`: there is no port 7; the switch has ports 0 to 2"
    );
    let past_width = refused(write("macs", vec![Write::Insert(station(MAC_B, 70_000))]));
    assert_eq!(
        past_width.to_string(),
        "the value of `port` does not fit its 16 bits (0 to 65535)"
    );
    let mut short_key = station(MAC_B, 1);
    short_key.key.pop();
    assert!(matches!(
        refused(write("macs", vec![Write::Insert(short_key)])),
        ControlError::Arity {
            expected: 2,
            got: 1,
            ..
        }
    ));
    let mut bad_action = station(MAC_B, 1);
    bad_action.action = "flood".into();
    assert!(matches!(
        refused(write("macs", vec![Write::Insert(bad_action)])),
        ControlError::UnknownAction { .. }
    ));
    let mut prefix = station(MAC_B, 1);
    prefix.key[1] = Match::Prefix {
        value: MAC_B,
        len: 8,
    };
    assert!(matches!(
        refused(write("macs", vec![Write::Insert(prefix)])),
        ControlError::MatchKind { .. }
    ));
    // A batch whose third insert does not fit: the first two are taken back.
    let batch = (10..13).map(|m| Write::Insert(station(m, 1))).collect();
    assert!(matches!(
        refused(write("macs", batch)),
        ControlError::TableFull { capacity: 3, .. }
    ));
    // A batch that ends in an insert of a key that exists: the modify before it is undone.
    let batch = vec![
        Write::Modify(station(0x0200_0000_0001, 2)),
        Write::Insert(station(0x0200_0000_0001, 1)),
    ];
    assert!(matches!(
        refused(write("macs", batch)),
        ControlError::Exists { .. }
    ));
    assert!(matches!(
        refused(write("macs", vec![Write::Delete(station(MAC_B, 0).key)])),
        ControlError::NoSuchEntry { .. }
    ));
    let as_register = refused(Request::ReadRegister {
        name: "macs".into(),
        first: 0,
        count: 1,
    });
    assert!(
        as_register.to_string().contains("`macs`: it is a table"),
        "{as_register}"
    );
    let after = sw.read("macs");
    assert_eq!(before.len(), 1);
    let strip = |e: &[Entry]| {
        e.iter()
            .map(|e| (e.key.clone(), e.params.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&after), strip(&before));
    assert_eq!(
        sw.verdicts(),
        vec![Some(Verdict::Drop(stateplane_runtime::DropReason::program(0))); WORKERS],
        "the data plane still misses"
    );
}

#[test]
fn learned_stations_are_read_deleted_and_their_ageing_streamed() {
    let sw = Switch::start("l2learn", "ageing = 5\ncapacity = 64", frame_to_b());
    let stream = sw.plane.subscribe();
    sw.verdicts();
    let learned = sw.read("stations");
    assert_eq!(learned.len(), 1, "the sender 02:..:0a was learned");
    assert_eq!(learned[0].key, [Match::Exact(0), Match::Exact(MAC_A)]);
    assert_eq!(learned[0].params, [0], "on port 0");
    assert!(matches!(
        sw.plane
            .submit(write("stations", vec![Write::Insert(station(MAC_B, 1))]))
            .unwrap_err(),
        ControlError::ReadOnly { .. }
    ));

    // The sender falls silent (the frames now come from a group address, which teaches
    // nothing) and the clock passes the ageing time.
    let mut quiet = frame_to_b();
    quiet[6] = 1;
    *sw.frame.lock().unwrap() = quiet;
    sw.verdicts();
    sw.clock.store(100 * SECOND, Ordering::Release);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut aged: Vec<Notification> = Vec::new();
    while aged.len() < WORKERS && Instant::now() < deadline {
        aged.extend(stream.try_iter());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!aged.is_empty(), "an ageing notification within 10 s");
    for n in &aged {
        assert_eq!(n.table, "stations");
        assert_eq!(n.kind, NotificationKind::IdleTimeout { deleted: true });
        assert_eq!(n.entry.key[1], Match::Exact(MAC_A));
    }
    assert!(sw.read("stations").is_empty());
}

#[test]
fn a_learned_station_deleted_by_the_control_plane_is_learned_again() {
    let sw = Switch::start("l2learn", "capacity = 64", frame_to_b());
    sw.verdicts();
    let key = vec![Match::Exact(0), Match::Exact(MAC_A)];
    let mut quiet = frame_to_b();
    quiet[6] = 1;
    *sw.frame.lock().unwrap() = quiet;
    sw.verdicts();
    sw.plane
        .submit(write("stations", vec![Write::Delete(key.clone())]))
        .unwrap();
    assert!(sw.read("stations").is_empty());
    *sw.frame.lock().unwrap() = frame_to_b();
    sw.verdicts();
    assert_eq!(sw.read("stations")[0].key, key);
}

fn route(prefix: u128, len: u8, port: u128) -> Entry {
    Entry {
        key: vec![Match::Prefix { value: prefix, len }],
        action: "route".into(),
        params: vec![port, 0x0200_0000_0b01],
        priority: 0,
        hits: 0,
    }
}

#[test]
fn route_changes_reach_every_worker_and_fall_back_to_the_covering_prefix() {
    let sw = Switch::start(
        "router",
        "routes = []",
        crate::testutil::udp_frame("198.19.7.9", 64),
    );
    let no_route = Some(Verdict::Drop(stateplane_runtime::DropReason::program(0)));
    assert_eq!(sw.verdicts(), vec![no_route; WORKERS]);
    let net16 = 0xc613_0000; // 198.19.0.0
    let net24 = 0xc613_0700; // 198.19.7.0
    let add = |p, len, port| write("routes4", vec![Write::Insert(route(p, len, port))]);
    sw.plane.submit(add(net16, 16, 2)).unwrap();
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(2)); WORKERS]);
    sw.plane.submit(add(net24, 24, 1)).unwrap();
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(1)); WORKERS]);

    // Refused: an existing prefix, a port the switch lacks; neither changes a route.
    assert!(matches!(
        sw.plane.submit(add(net24, 24, 2)),
        Err(ControlError::Exists { .. })
    ));
    let batch = write(
        "routes4",
        vec![
            Write::Modify(route(net24, 24, 2)),
            Write::Insert(route(0xc613_0800, 24, 9)),
        ],
    );
    assert_eq!(
        sw.plane.submit(batch).unwrap_err().to_string(),
        "`port`: there is no port 9; the switch has ports 0 to 2"
    );
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(1)); WORKERS]);
    let routes = sw.read("routes4");
    assert_eq!(routes.len(), 2);

    let delete = write("routes4", vec![Write::Delete(route(net24, 24, 0).key)]);
    sw.plane.submit(delete).unwrap();
    assert_eq!(
        sw.verdicts(),
        vec![Some(Verdict::Forward(2)); WORKERS],
        "the /16 covers the /24's addresses again"
    );
}

#[test]
fn acl_rule_counters_are_read_summed_over_workers_and_reset() {
    let config = r#"
        capacity = 2
        rules = [ { action = "deny", dst = "198.19.7.0/24" },
                  { action = "permit", dst = "198.19.0.0/16" } ]
    "#;
    let sw = Switch::start("acl", config, crate::testutil::udp_frame("198.19.7.9", 64));
    sw.verdicts();
    let read = |first, count| match sw.plane.submit(Request::ReadRegister {
        name: "rule_packets".into(),
        first,
        count,
    }) {
        Ok(done) => done.reply,
        Err(e) => panic!("{e}"),
    };
    let Reply::Values(all) = read(0, 3) else {
        panic!("a register read answers values")
    };
    assert!(
        all[0] >= 2 * WORKERS as u128,
        "the deny rule counted on both workers: {all:?}"
    );
    assert_eq!(
        all[1..],
        [0, 0],
        "the permit rule and the default saw nothing"
    );
    assert!(matches!(
        sw.plane.submit(Request::ReadRegister {
            name: "rule_packets".into(),
            first: 2,
            count: 2
        }),
        Err(ControlError::OutOfRange { size: 3, .. })
    ));
    *sw.frame.lock().unwrap() = crate::testutil::udp_frame("198.18.0.9", 64);
    sw.verdicts();
    let Reply::Values(default) = read(2, 1) else {
        panic!("a register read answers values")
    };
    assert!(
        default[0] >= 2,
        "an address no rule matches counts as the default: {default:?}"
    );
    *sw.frame.lock().unwrap() = vec![0; 60]; // not IP: not counted
    sw.verdicts();
    sw.plane
        .submit(Request::WriteRegister {
            name: "rule_packets".into(),
            first: 0,
            count: 3,
            value: 0,
        })
        .unwrap();
    sw.verdicts();
    assert_eq!(read(0, 3), Reply::Values(vec![0, 0, 0]));
}

/// A rule the way `ctl` writes one: `src=... dst=... proto=... src_port=... dst_port=...`.
fn acl_rule(dst: u128, dst_len: u8, dst_port: (u128, u128), priority: u32, action: &str) -> Entry {
    Entry {
        key: vec![
            Match::Prefix { value: 0, len: 0 },
            Match::Prefix {
                value: dst,
                len: dst_len,
            },
            Match::Ternary {
                value: 17,
                mask: 0xff,
            },
            Match::Range {
                low: 0,
                high: 65535,
            },
            Match::Range {
                low: dst_port.0,
                high: dst_port.1,
            },
        ],
        action: action.into(),
        params: Vec::new(),
        priority,
        hits: 0,
    }
}

#[test]
fn acl_rules_inserted_by_the_control_plane_take_effect_by_priority() {
    let config = r#"
        capacity = 3
        rules = [ { action = "permit", dst = "198.19.0.0/16" } ]
    "#;
    let sw = Switch::start("acl", config, crate::testutil::udp_frame("198.19.7.9", 64));
    let forwarded = Some(Verdict::Forward(1));
    let denied = Some(Verdict::Drop(stateplane_runtime::DropReason::program(1)));
    assert_eq!(sw.verdicts(), vec![forwarded; WORKERS]);
    let deny_udp_2 = acl_rule(0xc613_0700, 24, (2, 2), 10, "deny");
    let done = sw
        .plane
        .submit(write("rules", vec![Write::Insert(deny_udp_2.clone())]))
        .unwrap();
    assert!(done.version > 0);
    assert_eq!(
        sw.verdicts(),
        vec![denied; WORKERS],
        "the higher priority deny wins"
    );
    let rules = sw.read("rules");
    assert_eq!(rules.len(), 2);
    let ours = rules.iter().find(|r| r.priority == 10).unwrap();
    assert!(
        ours.hits >= 2 * WORKERS as u64,
        "its hits are the packets it denied"
    );

    // Below the configured rule's priority it loses; the same key and priority twice is
    // refused; four rules do not fit in three.
    let low = acl_rule(0xc613_0700, 24, (2, 2), 0, "deny");
    let refused = write(
        "rules",
        vec![
            Write::Insert(low.clone()),
            Write::Insert(deny_udp_2.clone()),
        ],
    );
    assert!(matches!(
        sw.plane.submit(refused),
        Err(ControlError::Exists { .. })
    ));
    let third = acl_rule(0xc613_0800, 24, (2, 2), 5, "deny");
    let fourth = acl_rule(0xc613_0900, 24, (2, 2), 5, "deny");
    let too_many = write("rules", vec![Write::Insert(third), Write::Insert(fourth)]);
    assert!(matches!(
        sw.plane.submit(too_many),
        Err(ControlError::TableFull { capacity: 3, .. })
    ));
    assert_eq!(sw.read("rules").len(), 2, "refused writes changed nothing");

    sw.plane
        .submit(write("rules", vec![Write::Delete(deny_udp_2.key.clone())]))
        .unwrap();
    sw.plane
        .submit(write("rules", vec![Write::Insert(low)]))
        .unwrap();
    assert_eq!(
        sw.verdicts(),
        vec![forwarded; WORKERS],
        "the configured permit ranks higher"
    );
}

#[test]
fn a_meter_set_on_a_rule_polices_what_the_rule_permits() {
    use stateplane_state::MeterConfig;
    let config = r#"
        capacity = 2
        rules = [ { action = "permit", dst = "198.19.0.0/16" } ]
    "#;
    let sw = Switch::start("acl", config, crate::testutil::udp_frame("198.19.7.9", 64));
    let policed = Some(Verdict::Drop(stateplane_runtime::DropReason::program(2)));
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(1)); WORKERS]);
    let set = |config| Request::SetMeter {
        name: "rule_meters".into(),
        first: 0,
        count: 1,
        config,
    };
    // A committed burst smaller than one frame and no excess: every packet is red.
    let tiny = MeterConfig::TrTcm {
        cir: 1,
        cbs: 1,
        pir: 1,
        pbs: 1,
    };
    sw.plane.submit(set(tiny)).unwrap();
    assert_eq!(sw.verdicts(), vec![policed; WORKERS]);
    let read = sw.plane.submit(Request::ReadMeter {
        name: "rule_meters".into(),
        first: 0,
        count: 3,
    });
    assert_eq!(
        read.unwrap().reply,
        Reply::Meters(vec![tiny, MeterConfig::Off, MeterConfig::Off])
    );
    let backwards = MeterConfig::TrTcm {
        cir: 10,
        cbs: 1,
        pir: 5,
        pbs: 1,
    };
    assert!(matches!(
        sw.plane.submit(set(backwards)),
        Err(ControlError::Invalid { .. })
    ));
    sw.plane.submit(set(MeterConfig::Off)).unwrap();
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(1)); WORKERS]);
}

#[test]
fn configured_guarantees_reach_the_declarations_and_unbuilt_or_bad_ones_are_named() {
    use stateplane_state::Guarantee;
    use std::collections::BTreeMap;
    let names = PortNames(vec!["a".into(), "b".into()]);
    let build_program = |program: &str, wanted: &[(&str, &[&str])]| {
        let wanted: BTreeMap<String, Vec<String>> = wanted
            .iter()
            .map(|(n, g)| (n.to_string(), g.iter().map(|s| s.to_string()).collect()))
            .collect();
        let factory = build(program, None, &names).unwrap();
        crate::with_guarantees(factory, &wanted, crate::ReplicationMode::Linearizable)
    };
    let build_with = |wanted: &[(&str, &[&str])]| build_program("conntrack", wanted);
    let factory = build_with(&[("connections", &["local"])]).unwrap();
    let declared = factory(1).declarations();
    assert_eq!(declared[0].guarantees, [Guarantee::Local]);
    // Nothing keeps this yet: it is refused by name, never accepted and ignored.
    let Err(e) = build_with(&[("connections", &["local", "exported"])]) else {
        panic!("'exported' is refused until a stage keeps it")
    };
    assert_eq!(e.field, "guarantees.connections");
    assert!(
        e.problem.starts_with("'exported' is not built yet: "),
        "{e}"
    );
    // Replication keeps counter's flows and conntrack's connections; a table no stage can
    // replicate yet is refused.
    let Err(e) = build_program("hh", &[("sketch", &["replicated"])]) else {
        panic!("hh's sketch is not replicated yet")
    };
    assert!(
        e.problem
            .contains("`sketch` cannot be replicated linearizably yet")
            && e.problem.contains("set replication.mode = \"bounded\""),
        "{e}"
    );
    // A table with no snapshots is not sent to bounded mode.
    let Err(e) = build_program("l2", &[("macs", &["replicated"])]) else {
        panic!("l2's macs are not replicated yet")
    };
    assert!(
        e.problem
            .contains("`macs` cannot be replicated linearizably yet")
            && !e.problem.contains("bounded")
            && e.problem.contains("docs/REPLICATION.md says what is built"),
        "{e}"
    );
    let replicated = build_with(&[("connections", &["replicated"])]).unwrap();
    assert_eq!(
        replicated(0).declarations()[0].guarantees,
        [Guarantee::Replicated]
    );
    let replicated = build_program("counter", &[("flows", &["replicated"])]).unwrap();
    assert_eq!(
        replicated(0).declarations()[0].guarantees,
        [Guarantee::Replicated]
    );
    // A table whose program does not track it cannot be synced (acl's ternary rules);
    // conntrack's can.
    let Err(e) = build_program("acl", &[("rules", &["synced"])]) else {
        panic!("a table whose changes nothing tracks is not synced")
    };
    assert!(e.problem.contains("cannot be synced"), "{e}");
    assert!(
        e.problem.contains("not the rules, routes and meters"),
        "{e}"
    );
    // Its rule counters can, each lane its own state.
    let counters = build_program(
        "acl",
        &[("rule_packets", &["synced"]), ("rule_bytes", &["synced"])],
    );
    let counters = counters.unwrap()(0).synced();
    assert_eq!(counters.iter().map(|s| s.0).collect::<Vec<_>>(), [0, 1]);
    let synced = build_with(&[("connections", &["synced"])]).unwrap();
    assert_eq!(synced(0).synced().len(), 1, "tracked on every instance");
    let Err(e) = build_with(&[("conections", &["synced"])]) else {
        panic!("a misspelt name is refused")
    };
    assert_eq!(e.field, "guarantees.conections");
    assert!(e.problem.contains("it declares: connections"), "{e}");
    let Err(e) = build_with(&[("connections", &["durable"])]) else {
        panic!("an unknown guarantee is refused")
    };
    assert!(
        e.problem.contains("local, synced, replicated, exported"),
        "{e}"
    );
}

/// A synced table's room (a write's staging, the saves of its entries) is claimed from
/// the run's memory budget for every copy when the configuration is checked, under the
/// guarantee's name; a budget that cannot hold it refuses the configuration, naming it.
#[test]
fn a_synced_tables_room_is_claimed_from_the_memory_budget() {
    let names = PortNames(vec!["a".into(), "b".into()]);
    let wanted = [("connections".to_string(), vec!["synced".to_string()])].into();
    let table = toml::from_str("capacity = 65536").unwrap();
    let synced = |limit| {
        stateplane_mem::budget::scope(budget(limit), || {
            let factory = build("conntrack", Some(&table), &names).unwrap();
            crate::with_guarantees(factory, &wanted, crate::ReplicationMode::Linearizable)
        })
    };
    let (factory, claimed) = synced(u64::MAX);
    let mut probe = factory.unwrap()(0);
    probe.track("connections", 0);
    let room = probe.synced_room_bytes();
    assert!(room > 8 << 20, "{room}");
    let share = (claimed.shares.iter())
        .find(|s| s.setting == "guarantees.connections")
        .unwrap();
    assert_eq!((share.each, share.copies), (room, WORKERS as u64 + 1));
    let Err(e) = synced(claimed.bytes - 1).0 else {
        panic!("a budget one byte short holds the table but not its room")
    };
    assert_eq!(e.field, "guarantees.connections");
}

#[test]
fn a_synced_sketch_is_tracked_on_every_instance_and_the_rest_is_the_programs() {
    use stateplane_state::{Guarantee, changes};
    let names = PortNames(vec!["a".into(), "b".into()]);
    let wanted = [("sketch".to_string(), vec!["synced".to_string()])].into();
    let table = "width = 64\ndepth = 2\ntenants = 1\nmap = { a = \"b\", b = \"a\" }";
    let factory = build("hh", Some(&toml::from_str(table).unwrap()), &names).unwrap();
    let factory =
        crate::with_guarantees(factory, &wanted, crate::ReplicationMode::Linearizable).unwrap();
    let mut program = factory(1);
    let sketch = program
        .declarations()
        .into_iter()
        .find(|d| d.name == "sketch");
    assert_eq!(sketch.map(|d| d.guarantees), Some(vec![Guarantee::Synced]));
    // Two sketches (one tenant, and the one the others share) of 2 rows of 64.
    assert_eq!(program.synced(), [(0, 256)]);
    let mut taken = Vec::new();
    assert_eq!(program.write_synced(0, 255, 5), Some(0));
    assert_eq!(program.read_synced(0, 255), Some(5));
    // A value wider than the sketch's 32-bit counters is refused and counted, not cut.
    assert_eq!(program.write_synced(0, 254, 1 << 32), None);
    assert_eq!(program.write_synced(0, 253, u64::from(u32::MAX)), Some(0));
    assert_eq!(program.read_synced(0, 254), Some(0));
    assert_eq!(program.commit_synced_write(), 1, "the value too wide");
    assert_eq!(program.commit_synced_write(), 0, "counted once");
    assert_eq!(program.read_synced(0, 256), None);
    assert!(program.changes(&mut taken, usize::MAX));
    let change = |index, new| changes::Change {
        state: 0,
        index,
        old: 0,
        new,
        exact: false,
        by_write: false,
    };
    assert_eq!(taken, [change(253, u64::from(u32::MAX)), change(255, 5)]);
    // The wrapper hands on what the program says of its workers (kv runs on one).
    let kv_table = toml::from_str("server = \"198.19.0.100\"\nclients = \"a\"\nbackend = \"b\"");
    let kv = build("kv", Some(&kv_table.unwrap()), &names).unwrap();
    let kv = crate::with_guarantees(
        kv,
        &[("cache".to_string(), vec!["local".to_string()])].into(),
        crate::ReplicationMode::Linearizable,
    )
    .unwrap();
    assert!(kv(0).check_workers(2, false).is_err());
}

#[test]
fn a_big_table_is_read_page_by_page_and_whole() {
    let sw = Switch::start("l2", "capacity = 20000", frame_to_b());
    let batch = (0..20_000u128)
        .map(|i| Write::Insert(station(0x0200_0000_0000 + i, 1)))
        .collect();
    let inserted = sw.plane.submit(write("macs", batch)).unwrap().version;
    let read = sw.plane.read("macs", None).unwrap();
    let Reply::Entries(entries) = read.reply else {
        panic!("a read answers entries")
    };
    assert_eq!(
        entries.len(),
        20_000,
        "every entry, once, merged over both workers"
    );
    assert!(
        read.version >= inserted + 3,
        "more than one page: {} slots are read {} at a time",
        20_000 * 8 / 7,
        stateplane_state::control::READ_PAGE
    );
    let one = sw
        .plane
        .read("macs", Some(station(0x0200_0000_0007, 0).key))
        .unwrap();
    assert_eq!(one.version, read.version + 1, "a key is one request");
    assert!(matches!(one.reply, Reply::Entries(e) if e.len() == 1));
}

#[test]
fn a_learning_switch_asked_for_digests_streams_each_station_it_learns() {
    // Frames from a group address teach nothing until the stream is subscribed.
    let mut quiet = frame_to_b();
    quiet[6] = 1;
    let sw = Switch::start("l2learn", "digests = true", quiet);
    let stream = sw.plane.subscribe();
    *sw.frame.lock().unwrap() = frame_to_b();
    sw.verdicts();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got: Vec<Notification> = Vec::new();
    while got.is_empty() && Instant::now() < deadline {
        got.extend(stream.try_iter());
        std::thread::sleep(Duration::from_millis(1));
    }
    let n = got.first().expect("a digest within 10 s");
    assert_eq!(
        (n.table.as_str(), n.kind.clone()),
        ("stations", NotificationKind::Digest)
    );
    assert_eq!(n.entry.key, [Match::Exact(0), Match::Exact(MAC_A)]);
    assert_eq!(n.entry.params, [0], "learned on port 0");
    // A station already known sends no second digest.
    sw.verdicts();
    std::thread::sleep(Duration::from_millis(20));
    let more: Vec<Notification> = stream.try_iter().collect();
    assert!(
        got.len() + more.len() <= WORKERS,
        "one digest per worker at most: {more:?}"
    );
}

/// A budget of `limit` bytes for the program kept once per worker and once more.
fn budget(limit: u64) -> stateplane_mem::budget::Budget {
    crate::testutil::budget(limit, WORKERS as u64 + 1)
}

/// Rules added through the control API take the run's memory budget, each copy of the
/// pipeline its share, counted at the most rules held (a rule deleted leaves its room in
/// the tables' maps for the next): past it a batch is refused whole, saying so, and no
/// worker holds any of it; once rules are deleted, as many can be added again.
#[test]
fn rules_past_the_memory_budget_are_refused_whole() {
    use crate::pipeline::Pipeline;
    use stateplane_state::{FlowChange, FlowFilter};
    let config = r#"rules = ["priority=1,actions=output:1"]"#;
    let names = PortNames(vec!["a".into(), "b".into(), "c".into()]);
    let table: toml::Value = toml::from_str(config).unwrap();
    let (_, at_load) =
        stateplane_mem::budget::scope(budget(u64::MAX), || build("pipeline", Some(&table), &names));
    let copies = WORKERS as u64 + 1;
    let room_for_100_more =
        copies * (Pipeline::bytes_for_rules(101, 1) - Pipeline::bytes_for_rules(1, 1));
    let frame = crate::testutil::udp_frame("198.19.7.9", 64);
    let sw = Switch::start_within("pipeline", config, frame, at_load.bytes + room_for_100_more);
    let add = |from: usize, count: usize| {
        let lines = (from..from + count)
            .map(|i| format!("priority=9,udp,tp_dst={i},actions=output:2"))
            .collect();
        sw.plane.submit(flows(FlowChange::Add {
            lines,
            keep_counters: false,
        }))
    };
    let e = add(0, 101).err().unwrap();
    assert!(matches!(e, ControlError::OverBudget { .. }), "{e}");
    let message = e.to_string();
    assert!(
        message.starts_with("table `flows`: 102 rules in a pipeline take")
            && message.contains("past the memory budget")
            && message.ends_with("nothing was written"),
        "{message}"
    );
    assert_eq!(
        dump(&sw, FlowFilter::default()).len(),
        1,
        "no worker has any of it"
    );
    add(0, 100).unwrap();
    assert_eq!(dump(&sw, FlowFilter::default()).len(), 101);
    assert!(add(100, 1).is_err(), "full to the budget");
    sw.plane
        .submit(flows(FlowChange::Delete(FlowFilter::default())))
        .unwrap();
    assert!(dump(&sw, FlowFilter::default()).is_empty());
    add(0, 101).unwrap();
    assert!(add(101, 1).is_err());
    // Actions past a rule's share take room too, counted as though every rule took them:
    // twelve each for 101 rules do not fit what is left; two do, needing none.
    let modify = |actions: String| {
        sw.plane.submit(flows(FlowChange::Modify {
            filter: FlowFilter::default(),
            actions,
        }))
    };
    let e = modify("dec_ttl,".repeat(11) + "output:2").err().unwrap();
    assert!(matches!(e, ControlError::OverBudget { .. }), "{e}");
    assert!(
        dump(&sw, FlowFilter::default())
            .iter()
            .all(|f| f.rule.ends_with("actions=output:2"))
    );
    modify("dec_ttl,output:1".into()).unwrap();
}

fn flows(change: stateplane_state::FlowChange) -> Request {
    Request::Flows {
        name: "flows".into(),
        change,
    }
}

fn dump(sw: &Switch, filter: stateplane_state::FlowFilter) -> Vec<stateplane_state::FlowStat> {
    match sw
        .plane
        .submit(flows(stateplane_state::FlowChange::Dump(filter)))
        .unwrap()
        .reply
    {
        Reply::Flows(f) => f,
        other => panic!("a dump answered {other:?}"),
    }
}

/// OpenFlow's add: a rule with the table, priority and match of one there replaces it
/// (new actions, counters from zero) instead of standing beside it; one of another
/// priority or match is a rule of its own.
#[test]
fn adding_a_rule_identical_in_match_and_priority_replaces_it() {
    use stateplane_state::{FlowChange, FlowFilter};
    let frame = crate::testutil::udp_frame("198.19.7.9", 64);
    let sw = Switch::start(
        "pipeline",
        r#"rules = ["priority=5,udp,nw_dst=198.19.0.0/16,actions=output:1"]"#,
        frame.clone(),
    );
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(1)); WORKERS]);
    assert!(dump(&sw, FlowFilter::default())[0].packets > 0);
    // Traffic the rule does not match, so that its counters stand still.
    *sw.frame.lock().unwrap() = crate::testutil::udp_frame("198.20.0.1", 64);
    sw.verdicts();
    let add_keeping = |line: &str, keep_counters| {
        sw.plane
            .submit(flows(FlowChange::Add {
                lines: vec![line.to_string()],
                keep_counters,
            }))
            .unwrap()
    };
    let add = |line: &str| add_keeping(line, false);
    add("priority=5,udp,nw_dst=198.19.0.0/16,actions=output:2");
    let all = dump(&sw, FlowFilter::default());
    assert_eq!(all.len(), 1, "replaced, not added: {all:?}");
    assert!(all[0].rule.contains("output:2"), "{}", all[0].rule);
    assert_eq!(
        all[0].packets, 0,
        "the replacement's counters start from zero"
    );
    *sw.frame.lock().unwrap() = frame;
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(2)); WORKERS]);
    // Asked to keep them, the replacement starts from the old rule's counters.
    *sw.frame.lock().unwrap() = crate::testutil::udp_frame("198.20.0.1", 64);
    sw.verdicts();
    let counted = dump(&sw, FlowFilter::default())[0].packets;
    assert!(counted > 0);
    add_keeping("priority=5,udp,nw_dst=198.19.0.0/16,actions=output:1", true);
    let all = dump(&sw, FlowFilter::default());
    assert_eq!(all.len(), 1);
    assert!(all[0].rule.contains("output:1"), "{}", all[0].rule);
    assert_eq!(all[0].packets, counted, "counters kept");
    // Another priority, or another match, is a rule of its own.
    add("priority=6,udp,nw_dst=198.19.0.0/16,actions=output:0");
    add("priority=5,udp,nw_dst=198.19.0.0/24,actions=output:0");
    assert_eq!(dump(&sw, FlowFilter::default()).len(), 3);
}

/// The rule pipeline through the control plane, on two workers running bursts: every
/// acknowledged change (an overlapping higher-priority insert, a modify, a delete) is what
/// the next packets get on every worker, counters are summed over workers, and refused
/// batches add nothing.
#[test]
fn rule_pipeline_changes_reach_every_worker_at_once() {
    use stateplane_state::{FlowChange, FlowFilter};
    let frame = crate::testutil::udp_frame("198.19.7.9", 64);
    let sw = Switch::start(
        "pipeline",
        r#"rules = ["priority=1,actions=output:1"]"#,
        frame.clone(),
    );
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(1)); WORKERS]);
    let add = |lines: &[&str]| {
        sw.plane.submit(flows(FlowChange::Add {
            lines: lines.iter().map(|l| l.to_string()).collect(),
            keep_counters: false,
        }))
    };
    // Cached microflows now belong to a new, higher-priority rule.
    add(&["priority=5,cookie=0x15,udp,nw_dst=198.19.0.0/16,actions=dec_ttl,output:2"]).unwrap();
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(2)); WORKERS]);

    let all = dump(&sw, FlowFilter::default());
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].priority, 5, "a dump lists the higher priority first");
    assert!(
        all[0].rule.contains("nw_dst=198.19.0.0/16"),
        "{}",
        all[0].rule
    );
    assert!(
        all.iter()
            .all(|f| f.bytes == f.packets * frame.len() as u64)
    );
    assert!(
        all[0].packets >= WORKERS as u64,
        "both workers' packets are summed"
    );

    // A batch with one bad line adds nothing, and says which line.
    let before = dump(&sw, FlowFilter::default()).len();
    for (batch, says) in [
        (
            &["priority=9,actions=output:0", "priority=x,actions=drop"][..],
            "line 2",
        ),
        (&["priority=9,actions=output:7"][..], "no port 7"),
        (&["table=3,actions=drop"][..], "no table 3"),
    ] {
        let e = add(batch).unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
    }
    assert_eq!(dump(&sw, FlowFilter::default()).len(), before);

    // Modify by cookie: the packets follow the new actions at once.
    let by_cookie = FlowFilter {
        table: Some(0),
        cookie: 0x05,
        cookie_mask: 0x0f,
    };
    let changed = sw
        .plane
        .submit(flows(FlowChange::Modify {
            filter: by_cookie,
            actions: "output:0".into(),
        }))
        .unwrap();
    assert!(matches!(changed.reply, Reply::Flows(ref f) if f.len() == 1));
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(0)); WORKERS]);
    let kept = dump(&sw, by_cookie);
    assert!(kept[0].packets > 0, "a modify keeps the rule's counters");

    let events = sw.plane.subscribe();
    let deleted = sw
        .plane
        .submit(flows(FlowChange::Delete(by_cookie)))
        .unwrap();
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(1)); WORKERS]);
    assert_eq!(dump(&sw, FlowFilter::default()).len(), 1);
    // One flow-removed notification, with the counts the delete answered.
    let Reply::Flows(deleted) = deleted.reply else {
        panic!("{deleted:?}")
    };
    let removed: Vec<Notification> = events.try_iter().collect();
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert_eq!(
        removed[0].kind,
        NotificationKind::FlowRemoved {
            reason: stateplane_state::RemovedReason::Delete,
            flow: deleted[0].clone()
        }
    );
}

/// Rule timeouts count every worker's packets: a rule hit only on worker 1 stays on
/// worker 0 too, and goes from both at one version once no worker has hit it for its idle
/// timeout, with one flow-removed notification holding both workers' counters. Stepped
/// by hand on a virtual clock: worker 1 takes the rule's traffic, worker 0 other traffic.
#[test]
fn a_rule_busy_on_one_worker_expires_on_none_and_its_removal_is_reported_once() {
    use stateplane_state::RemovedReason;
    let table: toml::Value = toml::from_str(
        r#"rules = ["priority=5,udp,nw_dst=198.19.0.0/16,idle_timeout=10,actions=output:1",
                    "priority=1,actions=output:2"]"#,
    )
    .unwrap();
    let names = PortNames(vec!["a".into(), "b".into(), "c".into()]);
    let factory = build("pipeline", Some(&table), &names).unwrap();
    let (plane, ends) = ControlPlane::new(WORKERS, factory(0));
    let events = plane.subscribe();
    let mut workers: Vec<Worker> = (ends.into_iter().enumerate())
        .map(|(w, end)| Worker::new(factory(w), w, WORKERS, 3, hasher()).with_control(end))
        .collect();
    let (hit, miss) = (
        crate::testutil::udp_frame("198.19.7.9", 64),
        crate::testutil::udp_frame("198.20.0.1", 64),
    );
    let mut step = |w: usize, frame: &[u8], t: u64| {
        let mut burst = Burst::with_capacity(1);
        burst.now_ns = t;
        burst.push(frame, frame.len() as u32, t, 0, 0);
        workers[w].handle(&mut burst);
        burst.descs()[0].verdict
    };
    let mut hits = 0;
    for s in 1..=41u64 {
        let t = s * SECOND;
        step(0, &miss, t);
        if s % 2 == 1 {
            assert_eq!(step(1, &hit, t), Verdict::Forward(1), "t = {s} s");
            hits += 1;
        } else {
            step(1, &miss, t);
        }
    }
    // Worker 0 has not seen the rule hit for 40 s; it still has it.
    assert_eq!(step(0, &hit, 41 * SECOND + 1), Verdict::Forward(1));
    hits += 1;
    assert!(events.try_recv().is_err(), "nothing removed yet");
    // Now no worker hits it: it goes once 10 s (and the second other workers take to
    // share their hits) have passed, from both workers at one version.
    let mut removed: Vec<Notification> = Vec::new();
    let mut gone_at = 0;
    for s in 42..=60u64 {
        for w in 0..WORKERS {
            step(w, &miss, s * SECOND);
        }
        removed.extend(events.try_iter());
        if !removed.is_empty() {
            gone_at = s;
            break;
        }
    }
    // The last hit was at 41 s: idle from 51 s, found so at the check of 53 s (a second's
    // grace), and applied by each worker at its next burst or two.
    assert!(
        (52..=56).contains(&gone_at),
        "gone at {gone_at} s: {removed:?}"
    );
    let t = (gone_at + 1) * SECOND;
    assert_eq!(
        [step(0, &hit, t), step(1, &hit, t)],
        [Verdict::Forward(2); 2]
    );
    assert_eq!(removed.len(), 1, "{removed:?}");
    let NotificationKind::FlowRemoved { reason, flow } = &removed[0].kind else {
        panic!("{removed:?}")
    };
    assert_eq!(*reason, RemovedReason::IdleTimeout);
    assert_eq!(flow.packets, hits, "both workers' hits");
    assert!(flow.rule.contains("idle_timeout=10"), "{}", flow.rule);
    assert!(flow.idle_ns >= 10 * SECOND, "{flow:?}");
}

/// `replace-flows`: a rule set made the pipeline's at one version on every worker,
/// changing only what differs (an identical rule keeps its counters), each deleted rule
/// reported once; a scope of one table leaves the others; a file that strays from its
/// table, or that the capacity cannot take, changes nothing.
#[test]
fn replacing_the_rule_set_changes_only_what_differs() {
    use stateplane_state::{FlowChange, FlowFilter, RemovedReason};
    let frame = crate::testutil::udp_frame("198.19.7.9", 64);
    let sw = Switch::start(
        "pipeline",
        r#"tables = 2
           capacity = 6
           rules = ["priority=5,udp,nw_dst=198.19.0.0/16,actions=output:1",
                    "priority=1,actions=output:2",
                    "priority=3,tcp,actions=output:0",
                    "table=1,priority=1,actions=drop"]"#,
        frame.clone(),
    );
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(1)); WORKERS]);
    let replace = |table: Option<u8>, lines: &[&str]| {
        sw.plane.submit(flows(FlowChange::Replace {
            table,
            lines: lines.iter().map(|l| l.to_string()).collect(),
        }))
    };
    let events = sw.plane.subscribe();
    let before = dump(&sw, FlowFilter::default());
    let kept_id = before.iter().find(|f| f.priority == 5).unwrap().id;
    let done = replace(
        Some(0),
        &[
            "# the same rule, written another way",
            "udp,priority=5,nw_dst=198.19.0.0/16,actions=output:1",
            "priority=1,actions=output:0",
            "priority=7,udp,nw_dst=198.19.7.0/24,actions=output:2",
        ],
    )
    .unwrap();
    let Reply::Replaced {
        removed,
        added,
        kept,
    } = done.reply
    else {
        panic!("{done:?}")
    };
    assert_eq!((added, kept), (2, 1));
    let mut gone: Vec<u16> = removed.iter().map(|f| f.priority).collect();
    gone.sort();
    assert_eq!(
        gone,
        [1, 3],
        "the changed rule and the one left out: {removed:?}"
    );
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(2)); WORKERS]);
    let after = dump(&sw, FlowFilter::default());
    assert_eq!(
        after.len(),
        4,
        "three in table 0, table 1's untouched: {after:?}"
    );
    let same = after.iter().find(|f| f.priority == 5).unwrap();
    assert_eq!(same.id, kept_id);
    assert!(same.packets >= WORKERS as u64, "kept with its counters");
    let reported: Vec<Notification> = events.try_iter().collect();
    assert_eq!(reported.len(), 2, "{reported:?}");
    assert!(reported.iter().all(|n| matches!(
        n.kind,
        NotificationKind::FlowRemoved {
            reason: RemovedReason::Delete,
            ..
        }
    )));
    // Refused whole: a rule outside the table replaced, or more rules than the capacity.
    let e = replace(
        Some(0),
        &["priority=2,actions=drop", "table=1,actions=drop"],
    )
    .unwrap_err();
    assert!(e.to_string().contains("must all be in it"), "{e}");
    let many: Vec<String> = (0..6)
        .map(|i| format!("priority={i},actions=drop"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let e = replace(Some(0), &many).unwrap_err();
    assert!(matches!(e, ControlError::TableFull { .. }), "{e}");
    let rules = |fs: Vec<stateplane_state::FlowStat>| -> Vec<(u64, String)> {
        fs.into_iter().map(|f| (f.id, f.rule)).collect()
    };
    assert_eq!(rules(dump(&sw, FlowFilter::default())), rules(after));
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(2)); WORKERS]);
    // Every table: what is not in the file goes, table 1's rule too.
    replace(None, &["priority=1,actions=output:1"]).unwrap();
    assert_eq!(dump(&sw, FlowFilter::default()).len(), 1);
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(1)); WORKERS]);
}

/// The key of `udp_frame(dst, _)`'s flow in `heavy_hitters`' fields (src dst proto
/// src_port dst_port vlan).
fn udp_flow_key(dst: &str) -> Vec<Match> {
    let ip = |a: &str| stateplane_state::control::ip_value(a.parse().unwrap());
    [ip("198.18.0.1"), ip(dst), 17, 1, 2, 0]
        .into_iter()
        .map(Match::Exact)
        .collect()
}

/// `CountersOf` says where each worker counts a key: the one flow crossing `hh` is the
/// only count in each of its sketch's rows, at exactly the counters named; a tenant not
/// seen yet is counted nowhere; and a key of the wrong shape is refused.
#[test]
fn each_worker_says_where_it_counts_a_key() {
    let config = "tenants = 2\nwidth = 64\ndepth = 3\ninterval_ms = 3600000\n\
                  threshold = 1000000\nmap = { a = \"b\" }";
    let sw = Switch::start("hh", config, crate::testutil::udp_frame("198.18.9.9", 64));
    sw.verdicts();
    let mut other_tenant = udp_flow_key("198.18.9.9");
    other_tenant[5] = Match::Exact(7);
    let asked = Request::CountersOf {
        table: "heavy_hitters".into(),
        keys: vec![udp_flow_key("198.18.9.9"), other_tenant],
    };
    let Reply::CountersOf(workers) = sw.plane.submit(asked).unwrap().reply else {
        panic!("no counters");
    };
    assert_eq!(
        workers.iter().map(|w| w.worker).collect::<Vec<_>>(),
        [0, 1],
        "every worker, in order"
    );
    let cells = &workers[0].cells[0];
    assert_eq!(cells.len(), 3, "one counter a row");
    assert!(workers[0].cells[1].is_empty(), "VLAN 7 has no sketch yet");
    // Both workers hash with the program's seed: the same counters.
    assert_eq!(workers[1].cells, workers[0].cells);
    // The register holds 3 sketches (2 tenants and the shared one) of 3 rows of 64. One
    // read, so every row is seen at the same moment.
    let Reply::Values(all) = (sw.plane)
        .submit(Request::ReadRegister {
            name: "sketch".into(),
            first: 0,
            count: 3 * 3 * 64,
        })
        .unwrap()
        .reply
    else {
        panic!("no values");
    };
    for (row, &cell) in cells.iter().enumerate() {
        let row_range = row * 64..(row + 1) * 64;
        assert!(row_range.contains(&(cell as usize)), "row {row}: {cell}");
        let counted: Vec<usize> = row_range.filter(|&i| all[i] > 0).collect();
        assert_eq!(
            counted,
            [cell as usize],
            "row {row}: only the flow's counter"
        );
    }
    let wrong = Request::CountersOf {
        table: "heavy_hitters".into(),
        keys: vec![vec![Match::Exact(1)]],
    };
    assert!(matches!(
        sw.plane.submit(wrong).unwrap_err(),
        ControlError::Arity { .. }
    ));
    let not_a_table = Request::CountersOf {
        table: "sketch".into(),
        keys: vec![],
    };
    assert!(sw.plane.submit(not_a_table).is_err());
}

/// A victim pushed into `udpflood`'s `victims` by the control plane (a controller that
/// found it from a sync collector's copy) is mitigated by the data plane as one it found
/// itself, until deleted.
#[test]
fn a_pushed_victim_is_mitigated_until_deleted() {
    let config = "threshold = 4000000000\nmap = { a = \"b\" }";
    let sw = Switch::start(
        "udpflood",
        config,
        crate::testutil::udp_frame("198.18.9.9", 64),
    );
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(1)); WORKERS]);
    let dst = || {
        vec![Match::Exact(stateplane_state::control::ip_value(
            "198.18.9.9".parse().unwrap(),
        ))]
    };
    let victim = Entry {
        key: dst(),
        action: "found".into(),
        params: vec![3, 5000],
        priority: 0,
        hits: 0,
    };
    sw.plane
        .submit(write("victims", vec![Write::Insert(victim)]))
        .unwrap();
    let dropped = sw.verdicts();
    assert!(
        dropped.iter().all(|v| matches!(v, Some(Verdict::Drop(_)))),
        "{dropped:?}"
    );
    sw.plane
        .submit(write("victims", vec![Write::Delete(dst())]))
        .unwrap();
    assert_eq!(sw.verdicts(), vec![Some(Verdict::Forward(1)); WORKERS]);
}
