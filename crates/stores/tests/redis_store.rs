//! The Redis store against a real redis-server on loopback (the test command installs it;
//! its absence fails these tests, never skips them): its functions answer as the memory
//! store does, step for step, on the server's clock; the largest fields go through; a
//! server that goes away is reported and reconnected, and one restarted keeps every
//! acknowledged write when it has an append-only file; `WAIT` holds back writes that are
//! not on enough replicas, so that a master failover loses none acknowledged (and without
//! it, can).
#![allow(clippy::unwrap_used)]

use stateplane_lab::RedisServer;
use stateplane_replication::protocol::KEEP_FOREVER;
use stateplane_replication::store::StoreConfig;
use stateplane_replication::{FlowBytes, Holder, Reply, Request};
use stateplane_stores::memory::MemoryStore;
use stateplane_stores::redis::{FUNCTIONS, RedisConfig, RedisStore, VERSION};
use stateplane_stores::redis_client::{self, RedisTls, TlsFiles};
use stateplane_stores::{StoreLink, Value};
use stateplane_test_pki::TestPki;
use std::time::{Duration, Instant};

const MS: u64 = 1_000_000;
const LEASE: u64 = 200 * MS;
const A: Holder = Holder {
    switch: 1,
    incarnation: 0,
};
const B: Holder = Holder {
    switch: 2,
    incarnation: 0,
};

fn free_port() -> u16 {
    stateplane_lab::free_loopback_port().unwrap()
}

fn redis_config(server: &RedisServer) -> RedisConfig {
    RedisConfig {
        min_lease: Duration::from_millis(100),
        max_lease: Duration::from_secs(10),
        ..RedisConfig::new(&server.url())
    }
}

/// Sends one request and waits (up to 2 s) for its answer; `None`: none came.
fn ask<K: stateplane_stores::StoreKey>(
    link: &mut dyn StoreLink<K>,
    from: Holder,
    request: Request<K, Value>,
) -> Option<Reply<K, Value>> {
    link.send(from, &mut vec![request]);
    let start = Instant::now();
    let mut out = Vec::new();
    while start.elapsed() < Duration::from_secs(2) {
        link.receive(&mut out);
        if let Some(reply) = out.pop() {
            return Some(reply);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

/// Asks for the leases of flows `0..n` in one send; the answers that came within 5 s.
fn acquire_many(link: &mut dyn StoreLink<u32>, n: u32) -> Vec<Reply<u32, Value>> {
    let mut requests: Vec<_> = (0..n)
        .map(|key| Request::Acquire {
            key,
            lease_ns: LEASE,
            nonce: 1,
        })
        .collect();
    link.send(A, &mut requests);
    let mut out = Vec::new();
    let start = Instant::now();
    while out.len() < n as usize && start.elapsed() < Duration::from_secs(5) {
        link.receive(&mut out);
    }
    out
}

fn acquire(key: u128, nonce: u64) -> Request<u128, Value> {
    Request::Acquire {
        key,
        lease_ns: LEASE,
        nonce,
    }
}

fn write(key: u128, epoch: u64, seq: u64, value: &[u8]) -> Request<u128, Value> {
    write_keeping(key, epoch, seq, value, KEEP_FOREVER)
}

fn write_keeping(
    key: u128,
    epoch: u64,
    seq: u64,
    value: &[u8],
    keep_ns: u64,
) -> Request<u128, Value> {
    Request::Write {
        key,
        epoch,
        seq,
        value: value.to_vec(),
        lease_ns: LEASE,
        keep_ns,
        alias: None,
    }
}

fn renew_keeping(key: u128, epoch: u64, nonce: u64, keep_ns: u64) -> Request<u128, Value> {
    Request::Renew {
        key,
        epoch,
        lease_ns: LEASE,
        nonce,
        keep_ns,
        alias: None,
    }
}

/// Each answer with its clock-dependent part (time left on another's lease) taken out.
fn timeless<K>(reply: Option<Reply<K, Value>>) -> Option<Reply<K, Value>> {
    reply.map(|r| match r {
        Reply::Held { key, nonce, .. } => Reply::Held {
            key,
            remaining_ns: 0,
            nonce,
        },
        r => r,
    })
}

/// The steps of the protocol's life, each answered by both stores.
fn life(link: &mut dyn StoreLink<u128>) -> Vec<Option<Reply<u128, Value>>> {
    let key = u128::MAX; // the largest key
    let mut answers = Vec::new();
    let mut step = |from, q| answers.push(timeless(ask(link, from, q)));
    step(A, acquire(key, 1));
    step(A, write(key, 1, 1, b"one"));
    step(A, write(key, 1, 1, b"one"));
    step(B, acquire(key, 2));
    step(A, renew_keeping(key, 1, 3, KEEP_FOREVER));
    // The largest sequence number, and a value with every byte.
    let every_byte: Vec<u8> = (0..=255).collect();
    step(A, write(key, 1, u64::MAX, &every_byte));
    step(A, write(key, 1, 2, b"older"));
    step(A, acquire(key, 4));
    std::thread::sleep(Duration::from_nanos(LEASE + 50 * MS));
    step(B, acquire(key, 5));
    step(A, write(key, 1, 3, b"fenced"));
    step(
        Holder {
            incarnation: 1,
            ..A
        },
        acquire(key, 6),
    );
    // A new flow beside it is granted with no state.
    step(A, acquire(7, 7));
    // States that time out: flow 8's 50 ms after its write; flow 9's renewal moves its
    // end past the lease; flow 10's is as long as a Lua number holds.
    for key in [8, 9, 10] {
        step(A, acquire(key, 8));
    }
    step(A, write_keeping(8, 1, 1, b"short", 50 * MS));
    step(A, write_keeping(9, 1, 1, b"renewed", 50 * MS));
    step(A, renew_keeping(9, 1, 9, 10_000 * MS));
    step(A, write_keeping(10, 1, 1, b"long", u64::MAX - 1));
    std::thread::sleep(Duration::from_nanos(LEASE + 50 * MS));
    for key in [8, 9, 10] {
        step(B, acquire(key, 10));
    }
    answers
}

/// Flows with aliases, as a NAT names them: a flow and its alias share their first two
/// bytes, their hash tag.
fn tagged(bytes: &[u8]) -> FlowBytes {
    FlowBytes::tagged(bytes, 2).unwrap()
}

/// The steps of aliases' lives, each answered by both stores: named by a write applied,
/// never by one refused, renewed with their flow, resolved to nothing when never named.
fn alias_life(link: &mut dyn StoreLink<FlowBytes>) -> Vec<Option<Reply<FlowBytes, Value>>> {
    let (flow, alias) = (tagged(&[1, 2, 3, 4]), tagged(&[1, 2, 9]));
    let other_alias = tagged(&[1, 2, 8]);
    let resolve = |alias, nonce| Request::Resolve { alias, nonce };
    let write = |epoch, seq, alias| Request::Write {
        key: flow,
        epoch,
        seq,
        value: vec![seq as u8],
        lease_ns: LEASE,
        keep_ns: 10_000 * MS,
        alias,
    };
    let mut answers = Vec::new();
    let mut step = |from, q| answers.push(timeless(ask(link, from, q)));
    step(A, resolve(alias, 1));
    step(
        A,
        Request::Acquire {
            key: flow,
            lease_ns: LEASE,
            nonce: 2,
        },
    );
    step(B, write(1, 1, Some(other_alias)));
    step(A, write(1, 1, Some(alias)));
    step(A, resolve(alias, 3));
    step(A, resolve(other_alias, 4));
    step(
        A,
        Request::Renew {
            key: flow,
            epoch: 1,
            lease_ns: LEASE,
            nonce: 5,
            keep_ns: 10_000 * MS,
            alias: Some(alias),
        },
    );
    step(A, write(1, 2, None));
    step(B, resolve(alias, 6));
    answers
}

#[test]
fn aliases_resolve_to_their_flows_as_in_the_memory_store_through_single_calls_and_batches() {
    let server = RedisServer::start(free_port(), false).unwrap();
    let memory = MemoryStore::<FlowBytes>::new(StoreConfig::default());
    let from_memory = alias_life(&mut memory.link());
    let (flow, alias) = (tagged(&[1, 2, 3, 4]), tagged(&[1, 2, 9]));
    assert_eq!(
        from_memory[0],
        Some(Reply::Resolved {
            alias,
            flow: None,
            nonce: 1
        })
    );
    assert!(matches!(from_memory[2], Some(Reply::Fenced { .. })));
    assert_eq!(
        from_memory[4],
        Some(Reply::Resolved {
            alias,
            flow: Some(flow),
            nonce: 3
        })
    );
    assert!(matches!(
        from_memory[5],
        Some(Reply::Resolved { flow: None, .. })
    ));
    assert!(matches!(from_memory[6], Some(Reply::Renewed { .. })));
    assert_eq!(
        from_memory[8],
        Some(Reply::Resolved {
            alias,
            flow: Some(flow),
            nonce: 6
        })
    );
    for batch in [64, 1] {
        server.cli(&["flushall"]);
        let redis = RedisStore::connect(RedisConfig {
            batch,
            ..redis_config(&server)
        })
        .unwrap();
        assert_eq!(
            alias_life(&mut redis.link().unwrap()),
            from_memory,
            "batch {batch}"
        );
        // The alias lives as long as its flow's record, renewals included.
        let ttl = |name: &str| -> i64 { server.cli(&["pttl", name]).trim().parse().unwrap() };
        let (flow_ttl, alias_ttl) = (
            ttl("stateplane:rep:{0102}0304"),
            ttl("stateplane:rep:alias:{0102}09"),
        );
        assert!(flow_ttl > 0 && alias_ttl > 0, "{flow_ttl} {alias_ttl}");
        assert!(
            flow_ttl.abs_diff(alias_ttl) < 1_000,
            "{flow_ttl} {alias_ttl}"
        );
    }
}

#[test]
fn the_functions_answer_as_the_memory_store_does() {
    let server = RedisServer::start(free_port(), false).unwrap();
    let redis = RedisStore::connect(redis_config(&server)).unwrap();
    let memory = MemoryStore::<u128>::new(StoreConfig {
        min_lease_ns: 100 * MS,
        max_lease_ns: 10_000 * MS,
        fencing: true,
        ..StoreConfig::default()
    });
    let from_redis = life(&mut redis.link::<u128>().unwrap());
    let from_memory = life(&mut memory.link());
    assert_eq!(from_redis, from_memory);
    // The single functions, one flow a call, answer as the batch does.
    server.cli(&["flushall"]);
    let single = RedisStore::connect(RedisConfig {
        batch: 1,
        ..redis_config(&server)
    })
    .unwrap();
    assert_eq!(life(&mut single.link::<u128>().unwrap()), from_memory);
    // And the life is what the protocol says.
    let every_byte: Vec<u8> = (0..=255).collect();
    assert!(matches!(
        from_redis[0],
        Some(Reply::Granted {
            epoch: 1,
            seq: 0,
            value: None,
            ..
        })
    ));
    assert!(matches!(from_redis[3], Some(Reply::Held { .. })));
    assert!(
        matches!(&from_redis[8], Some(Reply::Granted { epoch: 2, seq: u64::MAX, value: Some(v), .. }) if *v == every_byte)
    );
    assert!(matches!(
        from_redis[9],
        Some(Reply::Fenced { epoch: 1, .. })
    ));
    assert!(matches!(from_redis[10], Some(Reply::Held { .. })));
    assert!(matches!(
        from_redis[11],
        Some(Reply::Granted {
            epoch: 1,
            value: None,
            ..
        })
    ));
    // Past its time, flow 8's state is gone; flow 9's renewed one and flow 10's move.
    assert!(matches!(
        from_redis[19],
        Some(Reply::Granted {
            epoch: 2,
            seq: 1,
            value: None,
            ..
        })
    ));
    assert!(
        matches!(&from_redis[20], Some(Reply::Granted { epoch: 2, seq: 1, value: Some(v), .. }) if v == b"renewed")
    );
    assert!(
        matches!(&from_redis[21], Some(Reply::Granted { epoch: 2, seq: 1, value: Some(v), .. }) if v == b"long")
    );
    assert_eq!(from_redis.len(), 22);
}

/// Both stores with a retention of 100 ms (ten leases of at most 10 ms).
#[test]
fn records_past_their_retention_are_dropped_by_both_stores_alike() {
    let server = RedisServer::start(free_port(), false).unwrap();
    let redis = RedisStore::connect(RedisConfig {
        min_lease: Duration::from_millis(1),
        max_lease: Duration::from_millis(10),
        retain: Duration::from_millis(100),
        ..RedisConfig::new(&server.url())
    })
    .unwrap();
    let memory = MemoryStore::<u128>::new(StoreConfig {
        min_lease_ns: MS,
        max_lease_ns: 10 * MS,
        fencing: true,
        retain_ns: 100 * MS,
    });
    let run = |link: &mut dyn StoreLink<u128>| {
        // Flow 1's state is kept forever, flow 2's for 600 ms: past the retention.
        let mut answers = vec![ask(link, A, acquire(1, 1)), ask(link, A, acquire(2, 1))];
        answers.push(ask(link, A, write(1, 1, 1, b"one")));
        answers.push(ask(link, A, write_keeping(2, 1, 1, b"two", 600 * MS)));
        std::thread::sleep(Duration::from_millis(250));
        // Flow 1's record is gone: a new one, its epoch and sequence from the start; flow
        // 2's stays while its state lives, a grant on the way not shortening it.
        answers.push(ask(link, B, acquire(1, 2)));
        answers.push(ask(link, B, acquire(2, 2)));
        std::thread::sleep(Duration::from_millis(200));
        answers.push(ask(link, A, acquire(2, 3)));
        std::thread::sleep(Duration::from_millis(500));
        answers.push(ask(link, A, acquire(2, 4)));
        answers
    };
    let from_redis = run(&mut redis.link::<u128>().unwrap());
    let from_memory = run(&mut memory.link());
    assert_eq!(from_redis, from_memory);
    let granted = |i: usize| match &from_memory[i] {
        Some(Reply::Granted {
            epoch, seq, value, ..
        }) => (*epoch, *seq, value.clone()),
        other => panic!("{i}: {other:?}"),
    };
    assert_eq!(granted(4), (1, 0, None));
    assert_eq!(granted(5), (2, 1, Some(b"two".to_vec())));
    assert_eq!(granted(6), (3, 1, Some(b"two".to_vec())));
    assert_eq!(granted(7), (1, 0, None));
}

#[test]
fn many_requests_share_a_round_trip() {
    let server = RedisServer::start(free_port(), false).unwrap();
    let redis = RedisStore::connect(redis_config(&server)).unwrap();
    let mut link = redis.link::<u32>().unwrap();
    let out = acquire_many(&mut link, 2_000);
    assert_eq!(out.len(), 2_000);
    assert!(
        out.iter()
            .all(|r| matches!(r, Reply::Granted { epoch: 1, .. }))
    );
    let c = link.counters();
    assert!(c.round_trips < 10, "{c:?}");
    // Writes and renewals of every flow, mixed, in one send: each answered in its kind.
    let mut requests: Vec<Request<u32, Value>> = Vec::new();
    for r in &out {
        if let Reply::Granted { key, epoch, .. } = *r {
            requests.push(if key % 2 == 0 {
                Request::Write {
                    key,
                    epoch,
                    seq: 1,
                    value: key.to_le_bytes().to_vec(),
                    lease_ns: 1_000 * MS,
                    keep_ns: KEEP_FOREVER,
                    alias: None,
                }
            } else {
                Request::Renew {
                    key,
                    epoch,
                    lease_ns: 1_000 * MS,
                    nonce: 3,
                    keep_ns: 10_000 * MS,
                    alias: None,
                }
            });
        }
    }
    link.send(A, &mut requests);
    let mut answers = Vec::new();
    let start = std::time::Instant::now();
    while answers.len() < 2_000 && start.elapsed() < Duration::from_secs(5) {
        link.receive(&mut answers);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(answers.len(), 2_000);
    for a in &answers {
        match a {
            Reply::Written { key, seq: 1, .. } => assert_eq!(key % 2, 0),
            Reply::Renewed { key, nonce: 3, .. } => assert_eq!(key % 2, 1),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_lost_server_is_reported_and_reconnected_and_with_an_append_only_file_keeps_what_it_acknowledged()
 {
    let mut server = RedisServer::start(free_port(), true).unwrap();
    let redis = RedisStore::connect(redis_config(&server)).unwrap();
    let mut link = redis.link::<u32>().unwrap();
    assert!(matches!(
        ask(
            &mut link,
            A,
            Request::Acquire {
                key: 1,
                lease_ns: 10_000 * MS,
                nonce: 1
            }
        ),
        Some(Reply::Granted { .. })
    ));
    let w = |seq| Request::Write {
        key: 1u32,
        epoch: 1,
        seq,
        value: format!("v{seq}").into_bytes(),
        lease_ns: 10_000 * MS,
        keep_ns: KEEP_FOREVER,
        alias: None,
    };
    assert!(matches!(
        ask(&mut link, A, w(1)),
        Some(Reply::Written { seq: 1, .. })
    ));

    server.kill();
    assert_eq!(
        ask(&mut link, A, w(2)),
        None,
        "no answer while the server is away"
    );
    let c = link.counters();
    assert!(c.errors > 0 && c.connected == 0, "{c:?}");

    server.restart().unwrap();
    let start = Instant::now();
    let mut answer = None;
    while answer.is_none() && start.elapsed() < Duration::from_secs(5) {
        answer = ask(&mut link, A, w(2)); // the replica sends it again until answered
    }
    // The lease (10 s, its end on the server's clock) and write 1 were kept.
    assert!(
        matches!(answer, Some(Reply::Written { seq: 2, .. })),
        "{answer:?}"
    );
    let c = link.counters();
    assert!(c.reconnects >= 1 && c.connected == 1, "{c:?}");
    assert_eq!(
        server
            .cli(&["hget", "stateplane:rep:{00000001}", "v"])
            .trim(),
        "v2"
    );
}

#[test]
fn a_restart_without_persistence_loses_the_records_and_the_functions_come_back() {
    let mut server = RedisServer::start(free_port(), false).unwrap();
    let redis = RedisStore::connect(redis_config(&server)).unwrap();
    let mut link = redis.link::<u32>().unwrap();
    assert!(matches!(
        ask(&mut link, A, acquire_u32(1)),
        Some(Reply::Granted { epoch: 1, .. })
    ));
    server.restart().unwrap();
    let start = Instant::now();
    let mut answer = None;
    while answer.is_none() && start.elapsed() < Duration::from_secs(5) {
        answer = ask(&mut link, B, acquire_u32(2));
    }
    // What this loses is in docs/REPLICATION.md: the record and its lease are gone, so
    // another holder is granted the flow at once, from nothing.
    assert!(
        matches!(
            answer,
            Some(Reply::Granted {
                epoch: 1,
                value: None,
                ..
            })
        ),
        "{answer:?}"
    );
}

fn acquire_u32(nonce: u64) -> Request<u32, Value> {
    Request::Acquire {
        key: 1,
        lease_ns: LEASE,
        nonce,
    }
}

#[test]
fn wait_passes_writes_on_only_once_enough_replicas_have_them() {
    let primary = RedisServer::start(free_port(), false).unwrap();
    // Said at each connection (a log line): writes will be held back.
    let mut conn = (redis::Client::open(primary.url()).unwrap())
        .get_connection()
        .unwrap();
    let short = |conn: &mut redis::Connection, wanted| {
        redis_client::short_of_replicas(conn, &primary.url(), wanted)
    };
    let said = short(&mut conn, 1);
    assert!(
        (said.as_deref())
            .is_some_and(|s| s.contains("0 replica(s) connected where wait_replicas asks for 1")),
        "{said:?}"
    );
    let mut config = redis_config(&primary);
    config.wait = Some((1, Duration::from_millis(100)));
    let redis = RedisStore::connect(config).unwrap();
    let mut link = redis.link::<u32>().unwrap();
    let long = 10_000 * MS; // outlasting the replica's first sync
    let acquire = Request::Acquire {
        key: 1,
        lease_ns: long,
        nonce: 1,
    };
    assert!(matches!(
        ask(&mut link, A, acquire),
        Some(Reply::Granted { .. })
    ));
    let w = |seq| Request::Write {
        key: 1u32,
        epoch: 1,
        seq,
        value: vec![1],
        lease_ns: long,
        keep_ns: KEEP_FOREVER,
        alias: None,
    };
    // No replica: the write is applied but not acknowledged.
    assert_eq!(ask(&mut link, A, w(1)), None);
    assert!(link.counters().short_of_replicas >= 1);
    // With one, it is.
    let replica = RedisServer::start(free_port(), false).unwrap();
    replica.cli(&["replicaof", "127.0.0.1", &primary.port().to_string()]);
    let start = Instant::now();
    let mut answer = None;
    while answer.is_none() && start.elapsed() < Duration::from_secs(10) {
        answer = ask(&mut link, A, w(1));
    }
    assert!(
        matches!(answer, Some(Reply::Written { seq: 1, .. })),
        "{answer:?}"
    );
    assert_eq!(short(&mut conn, 1), None);
    let said = short(&mut conn, 2);
    assert!(
        (said.as_deref())
            .is_some_and(|s| s.contains("1 replica(s) connected where wait_replicas asks for 2")),
        "{said:?}"
    );
}

/// Flow 1's lease for holder A, `lease_ns` long, and the writes under it (`seq`, value).
fn lease_for_writes(
    link: &mut dyn StoreLink<u32>,
    lease_ns: u64,
) -> impl Fn(u64, &[u8]) -> Request<u32, Value> + use<> {
    let acquire = Request::Acquire {
        key: 1,
        lease_ns,
        nonce: 1,
    };
    let Some(Reply::Granted { epoch, .. }) = ask(link, A, acquire) else {
        panic!("granted");
    };
    move |seq, value| Request::Write {
        key: 1u32,
        epoch,
        seq,
        value: value.to_vec(),
        lease_ns,
        keep_ns: KEEP_FOREVER,
        alias: None,
    }
}

/// A replica of `primary`, once it has every write the primary has. Its full syncs start
/// at once when it is promoted (not after Redis 7's five seconds' wait for more replicas).
fn replica_of(primary: &RedisServer) -> RedisServer {
    let replica = RedisServer::start_with(free_port(), false, NO_SYNC_DELAY).unwrap();
    replica.cli(&["replicaof", "127.0.0.1", &primary.port().to_string()]);
    let start = Instant::now();
    // Up once its full sync is done (a WAIT would count the primary's other replicas too).
    while !(replica.cli(&["info", "replication"])).contains("master_link_status:up") {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the replica did not sync within 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    replica
}

/// A Redis master failover, as docs/REPLICATION.md states it: the master dies while its
/// replica lags (stopped with SIGSTOP, its link closed), and the replica is promoted. Without `WAIT`, a write
/// the master acknowledged before it died is lost; with `WAIT 1`, that write is never
/// acknowledged (short of replicas), so everything acknowledged is on the promoted
/// replica, and a switch on it goes on from there.
#[test]
fn a_master_failover_loses_acknowledged_writes_only_without_wait() {
    for wait in [false, true] {
        let mut primary = RedisServer::start(free_port(), false).unwrap();
        let replica = replica_of(&primary);
        let mut config = redis_config(&primary);
        if wait {
            config.wait = Some((1, Duration::from_millis(100)));
        }
        let redis = RedisStore::connect(config).unwrap();
        let mut link = redis.link::<u32>().unwrap();
        let lease = 300 * MS;
        let write = lease_for_writes(&mut link, lease);
        assert!(matches!(
            ask(&mut link, A, write(1, b"both have it")),
            Some(Reply::Written { seq: 1, .. })
        ));
        assert_eq!(primary.cli(&["wait", "1", "2000"]).trim(), "1");
        // Cut off: stopped, and its link closed (so nothing more reaches it).
        replica.pause().unwrap();
        assert_eq!(
            primary.cli(&["client", "kill", "type", "replica"]).trim(),
            "1"
        );
        let lagging = ask(&mut link, A, write(2, b"the master alone"));
        if wait {
            assert_eq!(lagging, None, "held back: no replica has it");
            assert!(link.counters().short_of_replicas >= 1);
        } else {
            assert!(
                matches!(lagging, Some(Reply::Written { seq: 2, .. })),
                "{lagging:?}"
            );
        }
        primary.kill();
        replica.resume().unwrap();
        assert_eq!(replica.cli(&["replicaof", "no", "one"]).trim(), "OK");
        // Another switch, on the promoted replica once the lease has passed.
        std::thread::sleep(Duration::from_nanos(lease + 100 * MS));
        let promoted = RedisStore::connect(redis_config(&replica)).unwrap();
        let granted = ask(
            &mut promoted.link::<u32>().unwrap(),
            B,
            Request::Acquire {
                key: 1,
                lease_ns: lease,
                nonce: 2,
            },
        );
        let Some(Reply::Granted {
            seq,
            value: Some(v),
            ..
        }) = granted
        else {
            panic!("the promoted replica grants the flow with its state: {granted:?}");
        };
        // Write 2 is lost either way; only without WAIT had it been acknowledged.
        assert_eq!(
            (seq, v.as_slice()),
            (1, &b"both have it"[..]),
            "wait {wait}"
        );
    }
}

/// A master's options that start a replica's full sync at once.
const NO_SYNC_DELAY: &[&str] = &["--repl-diskless-sync-delay", "0"];

/// A sentinel's count of `field` for master `name` (`num-slaves`, `num-other-sentinels`).
fn sentinel_count(sentinel: &RedisServer, name: &str, field: &str) -> Option<u64> {
    let info = sentinel.cli(&["sentinel", "master", name]);
    let lines: Vec<&str> = info.lines().collect();
    let at = lines.iter().position(|l| l.trim() == field)?;
    lines.get(at + 1)?.trim().parse().ok()
}

/// Through Redis Sentinel (`redis+sentinel://`), a master failover is followed without a
/// restart: the store's link, its master killed, connects again to the replica the
/// sentinel promoted and goes on writing under the lease it held; with `WAIT 1`, the
/// write acknowledged before the master died is on the promoted master (the other
/// replica, pointed at it by the sentinel, acknowledges the writes after).
#[test]
fn through_sentinel_the_store_follows_a_master_failover_and_keeps_what_it_acknowledged() {
    let mut primary = RedisServer::start_with(free_port(), false, NO_SYNC_DELAY).unwrap();
    let _replicas = [replica_of(&primary), replica_of(&primary)];
    let sentinel = RedisServer::sentinel(free_port(), "rep", primary.port()).unwrap();
    let start = Instant::now();
    while sentinel_count(&sentinel, "rep", "num-slaves") != Some(2) {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the sentinel found no replicas"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let url = format!("redis+sentinel://127.0.0.1:{}/rep", sentinel.port());
    let redis = RedisStore::connect(RedisConfig {
        wait: Some((1, Duration::from_millis(100))),
        min_lease: Duration::from_millis(100),
        max_lease: Duration::from_secs(30),
        ..RedisConfig::new(&url)
    })
    .unwrap();
    let mut link = redis.link::<u32>().unwrap();
    let lease = 30_000 * MS;
    let write = lease_for_writes(&mut link, lease);
    // Sent again until a replica has it in WAIT's 100 ms (a host this busy can miss it).
    let first = until_answered(&mut link, write(1, b"before"));
    assert!(
        matches!(first, Some(Reply::Written { seq: 1, .. })),
        "{first:?}"
    );
    // Both replicas have it (the lagging replica is the test above's): whichever the
    // sentinel promotes holds the lease and the write.
    assert_eq!(primary.cli(&["wait", "2", "2000"]).trim(), "2");
    primary.kill();
    // The same link goes on once the sentinel has promoted a replica.
    let answer = until_answered(&mut link, write(2, b"after"));
    assert!(
        matches!(answer, Some(Reply::Written { seq: 2, .. })),
        "{answer:?} {:?}",
        link.counters()
    );
    assert!(link.counters().reconnects >= 1, "{:?}", link.counters());
    let again = ask(
        &mut link,
        A,
        Request::Acquire {
            key: 1,
            lease_ns: lease,
            nonce: 2,
        },
    );
    assert!(
        matches!(&again, Some(Reply::Granted { seq: 2, value: Some(v), .. }) if v == b"after"),
        "{again:?}"
    );
    // A name the sentinel does not know, and no sentinel there: refused with the fix.
    let err = RedisStore::connect(RedisConfig::new(&format!(
        "redis+sentinel://127.0.0.1:{}/nobody",
        sentinel.port()
    )))
    .err()
    .unwrap();
    assert!(err.contains("no master of that name"), "{err}");
    let err = RedisStore::connect(RedisConfig::new(&format!(
        "redis+sentinel://127.0.0.1:{}/rep",
        free_port()
    )))
    .err()
    .unwrap();
    assert!(err.contains("is redis-sentinel running"), "{err}");
    // A sentinel's address that takes connections and never answers: refused in time.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis+sentinel://{}/rep", silent.local_addr().unwrap());
    let start = Instant::now();
    let err = RedisStore::connect(RedisConfig::new(&url)).err().unwrap();
    assert!(err.contains("no answer in time"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// A sentinel that asks for a password (the same as its master's, the common set-up) is
/// given the URL's; with none in the URL, the store is refused, saying to give it.
#[test]
fn a_sentinel_that_asks_for_a_password_is_given_the_urls() {
    let primary = RedisServer::start(free_port(), false).unwrap();
    let sentinel = RedisServer::sentinel(free_port(), "rep", primary.port()).unwrap();
    primary.cli(&["config", "set", "requirepass", "both-pass"]);
    sentinel.cli(&["sentinel", "set", "rep", "auth-pass", "both-pass"]);
    sentinel.cli(&["acl", "setuser", "default", "resetpass", ">both-pass"]);
    let at = format!("127.0.0.1:{}/rep", sentinel.port());
    let redis = RedisStore::connect(RedisConfig {
        min_lease: Duration::from_millis(100),
        ..RedisConfig::new(&format!("redis+sentinel://:both-pass@{at}"))
    })
    .unwrap();
    let granted = ask(
        &mut redis.link::<u32>().unwrap(),
        A,
        Request::Acquire {
            key: 1,
            lease_ns: LEASE,
            nonce: 1,
        },
    );
    assert!(
        matches!(granted, Some(Reply::Granted { .. })),
        "{granted:?}"
    );
    let err = RedisStore::connect(RedisConfig::new(&format!("redis+sentinel://{at}")))
        .err()
        .unwrap();
    assert!(err.contains("asks for a password"), "{err}");
}

/// A stand-in for a sentinel on loopback: it names `named` as the master of whatever name
/// it is asked for, and answers `+OK` to anything else (what a client sends as it
/// connects). Its threads end with the test's process.
fn sentinel_naming(named: std::net::SocketAddr) -> std::net::SocketAddr {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap();
    let serve = move |stream: std::net::TcpStream| -> Option<()> {
        let mut reader = BufReader::new(stream.try_clone().ok()?);
        let mut out = stream;
        let mut line = String::new();
        loop {
            // A command: `*N`, then N bulk strings (`$LEN`, then the bytes).
            line.clear();
            reader.read_line(&mut line).ok().filter(|&n| n > 0)?;
            let n: usize = line.trim().strip_prefix('*')?.parse().ok()?;
            let mut first = None;
            for _ in 0..2 * n {
                line.clear();
                reader.read_line(&mut line).ok()?;
                first = first.or_else(|| (!line.starts_with('$')).then(|| line.trim().to_string()));
            }
            let reply = match first?.eq_ignore_ascii_case("sentinel") {
                true => {
                    let (ip, port) = (named.ip().to_string(), named.port().to_string());
                    format!(
                        "*2\r\n${}\r\n{ip}\r\n${}\r\n{port}\r\n",
                        ip.len(),
                        port.len()
                    )
                }
                false => "+OK\r\n".to_string(),
            };
            out.write_all(reply.as_bytes()).ok()?;
        }
    };
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve(stream));
        }
    });
    at
}

/// The server a sentinel names must say it is the master: one that is a replica (a
/// failover under way, or a sentinel behind) is refused, and so is one that takes the
/// connection and never answers, in time. A replica named as the store is refused too,
/// saying to name its master.
#[test]
fn a_sentinel_naming_a_replica_or_a_silent_server_is_refused_in_time() {
    let primary = RedisServer::start(free_port(), false).unwrap();
    let replica = replica_of(&primary);
    let at = |addr: std::net::SocketAddr| format!("redis+sentinel://{addr}/rep");
    let loopback = |port| std::net::SocketAddr::from(([127, 0, 0, 1], port));
    // Named directly, a replica is refused with what to name instead.
    let err = RedisStore::connect(redis_config(&replica)).err().unwrap();
    assert!(err.contains("the server is a replica"), "{err}");
    let named_replica = sentinel_naming(loopback(replica.port()));
    let err = RedisStore::connect(RedisConfig::new(&at(named_replica)))
        .err()
        .unwrap();
    assert!(err.contains("is not a master"), "{err}");
    // The stand-in itself: a master it names is taken.
    let named_primary = sentinel_naming(loopback(primary.port()));
    assert!(RedisStore::connect(RedisConfig::new(&at(named_primary))).is_ok());
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let named_silent = sentinel_naming(silent.local_addr().unwrap());
    let start = Instant::now();
    let err = RedisStore::connect(RedisConfig::new(&at(named_silent)))
        .err()
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(err.contains("no answer in time"), "{err}");
}

/// Redis Sentinel over TLS (`rediss+sentinel://`): the sentinel and the master it names
/// both reached over TLS, trusting the CA given; without it, refused at start with the
/// setting to give.
#[test]
fn through_sentinel_over_tls_the_store_reaches_the_master_it_names() {
    let pki = TestPki::new("redis-sentinel-tls").unwrap();
    let files = pki.server_files();
    let master = RedisServer::start_tls(free_port(), free_port(), &files, false).unwrap();
    let sentinel = RedisServer::tls_sentinel(
        free_port(),
        free_port(),
        "rep",
        master.tls_port().unwrap(),
        &files,
    )
    .unwrap();
    let sentinel_tls = (sentinel.tls_url().unwrap()).replace("rediss://", "rediss+sentinel://");
    let url = format!("{sentinel_tls}rep");
    let redis = RedisStore::connect(RedisConfig {
        tls: tls_of(&pki, &url, Some("ca.pem"), None),
        ..RedisConfig::new(&url)
    })
    .unwrap();
    let mut link = redis.link::<u32>().unwrap();
    let _write = lease_for_writes(&mut link, LEASE);
    assert!(master.cli(&["dbsize"]).trim().parse::<u64>().unwrap() >= 1);
    let err = RedisStore::connect(RedisConfig::new(&url)).err().unwrap();
    assert!(err.contains("replication.tls_ca"), "{err}");
}

/// A request sent again while the first is still queued or on the connection (its
/// answer late because the store is busy) is not sent twice; once answered, it goes again.
#[test]
fn a_request_sent_again_while_it_waits_its_turn_is_not_sent_twice() {
    let server = RedisServer::start(free_port(), false).unwrap();
    let redis = RedisStore::connect(redis_config(&server)).unwrap();
    let mut link = redis.link::<u32>().unwrap();
    let ask = Request::Acquire {
        key: 5,
        lease_ns: LEASE,
        nonce: 1,
    };
    link.send(A, &mut vec![ask.clone(), ask.clone(), ask.clone()]);
    let mut answers = Vec::new();
    let start = Instant::now();
    while answers.is_empty() && start.elapsed() < Duration::from_secs(2) {
        link.receive(&mut answers);
    }
    std::thread::sleep(Duration::from_millis(50));
    link.receive(&mut answers);
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(link.counters().repeats_held, 2);
    // Answered: the same request goes again (and is answered again).
    assert!(matches!(
        self::ask(&mut link, A, ask),
        Some(Reply::Granted { epoch: 1, .. })
    ));
    assert_eq!(link.counters().requests, 4);
}

#[test]
fn a_wrong_url_or_setting_is_refused_at_start_with_the_fix() {
    let port = free_port();
    let err = RedisStore::connect(RedisConfig::new(&format!("redis://127.0.0.1:{port}/")))
        .err()
        .unwrap();
    assert!(err.contains("is redis-server running there?"), "{err}");
    let err = RedisStore::connect(RedisConfig {
        retain: Duration::from_secs(1),
        ..RedisConfig::new("redis://127.0.0.1:1/")
    })
    .err()
    .unwrap();
    assert!(err.contains("retention"), "{err}");
}

/// On a Redis Cluster of three masters (on loopback), the functions answer as the memory
/// store does, and flows' records spread over the masters, each whole on one (its key's
/// hash tag names the slot).
#[test]
fn a_cluster_of_three_masters_answers_as_the_memory_store_and_spreads_the_flows() {
    let servers = RedisServer::cluster().unwrap();
    let config = RedisConfig {
        cluster: true,
        ..redis_config(&servers[0])
    };
    let redis = RedisStore::connect(config).unwrap();
    let memory = MemoryStore::<u128>::new(StoreConfig {
        min_lease_ns: 100 * MS,
        max_lease_ns: 10_000 * MS,
        fencing: true,
        ..StoreConfig::default()
    });
    assert_eq!(
        life(&mut redis.link::<u128>().unwrap()),
        life(&mut memory.link())
    );
    // A flow and its alias are written in one call: in one slot, by their tag.
    let memory = MemoryStore::<FlowBytes>::new(StoreConfig::default());
    assert_eq!(
        alias_life(&mut redis.link().unwrap()),
        alias_life(&mut memory.link())
    );

    let mut link = redis.link::<u32>().unwrap();
    let out = acquire_many(&mut link, 300);
    assert_eq!(out.len(), 300, "{:?}", link.counters());
    for server in &servers {
        let keys: usize = server.cli(&["dbsize"]).trim().parse().unwrap();
        assert!(keys > 30, "a master holds {keys} of the flows");
    }
    // A node of it named as one server would have most flows redirected: refused.
    let err = RedisStore::connect(redis_config(&servers[1]))
        .err()
        .unwrap();
    assert!(err.contains("set cluster = true"), "{err}");
}

/// A server that may evict keys (a `maxmemory` and any policy but `noeviction`) would lose
/// acknowledged states: refused at start, and at every connection after (a policy changed
/// while the switch runs holds its requests until it is put back); one with no
/// `maxmemory`, or `noeviction`, is taken. On a cluster, every master is asked.
#[test]
fn a_server_that_evicts_keys_is_refused_at_every_connection() {
    for (limit, policy, refused) in [
        ("64mb", "allkeys-lru", true),
        ("64mb", "volatile-ttl", true),
        ("64mb", "noeviction", false),
        ("0", "allkeys-lru", false),
    ] {
        let server = RedisServer::start_with(
            free_port(),
            false,
            &["--maxmemory", limit, "--maxmemory-policy", policy],
        )
        .unwrap();
        match RedisStore::connect(redis_config(&server)) {
            Ok(_) => assert!(!refused, "{policy} with {limit}: taken"),
            Err(e) => {
                assert!(refused, "{policy} with {limit}: {e}");
                assert!(
                    e.contains(policy) && e.contains("set maxmemory-policy noeviction"),
                    "{e}"
                );
            }
        }
    }
    let server = RedisServer::start(free_port(), false).unwrap();
    let redis = RedisStore::connect(redis_config(&server)).unwrap();
    let mut link = redis.link::<u32>().unwrap();
    let acquire = |nonce| Request::Acquire {
        key: 1,
        lease_ns: LEASE,
        nonce,
    };
    assert!(matches!(
        ask(&mut link, A, acquire(1)),
        Some(Reply::Granted { .. })
    ));
    server.cli(&["config", "set", "maxmemory", "64mb"]);
    server.cli(&["config", "set", "maxmemory-policy", "allkeys-lfu"]);
    server.cli(&["client", "kill", "type", "normal"]);
    // The first after the kill finds its connection gone; the second, the new one refused.
    for nonce in [2, 3] {
        assert_eq!(ask(&mut link, A, acquire(nonce)), None);
    }
    assert_eq!(link.counters().connected, 0, "{:?}", link.counters());
    server.cli(&["config", "set", "maxmemory-policy", "noeviction"]);
    assert!(matches!(
        until_answered(&mut link, acquire(4)),
        Some(Reply::Granted { .. })
    ));

    // A user not let read INFO: the policy goes unchecked (said in the log), and the store
    // is taken.
    server.cli(&[
        "acl",
        "setuser",
        "no-info",
        "on",
        ">no-info-pass",
        "~*",
        "&*",
        "+@all",
        "-info",
    ]);
    let url = format!("redis://no-info:no-info-pass@127.0.0.1:{}/", server.port());
    let redis = RedisStore::connect(RedisConfig {
        min_lease: Duration::from_millis(100),
        ..RedisConfig::new(&url)
    })
    .unwrap();
    let granted = ask(&mut redis.link::<u32>().unwrap(), A, acquire(5));
    assert!(
        matches!(granted, Some(Reply::Granted { .. })),
        "{granted:?}"
    );
    // Nor can its replicas be counted: nothing said rather than a count made up.
    let mut conn = (redis::Client::open(url.as_str()).unwrap())
        .get_connection()
        .unwrap();
    assert_eq!(redis_client::short_of_replicas(&mut conn, &url, 1), None);

    let servers = RedisServer::cluster().unwrap();
    servers[2].cli(&["config", "set", "maxmemory", "64mb"]);
    servers[2].cli(&["config", "set", "maxmemory-policy", "volatile-lru"]);
    let err = RedisStore::connect(RedisConfig {
        cluster: true,
        ..redis_config(&servers[0])
    })
    .err()
    .unwrap();
    assert!(err.contains("volatile-lru"), "{err}");
}

/// Sends `request` again until it is answered (30 s at most): the answer.
fn until_answered(
    link: &mut dyn StoreLink<u32>,
    request: Request<u32, Value>,
) -> Option<Reply<u32, Value>> {
    let start = Instant::now();
    let mut answer = None;
    while answer.is_none() && start.elapsed() < Duration::from_secs(30) {
        answer = ask(link, A, request.clone());
    }
    answer
}

/// On a Redis Cluster of three masters with a replica each, `WAIT 1` goes to every master:
/// a write is acknowledged only once the replica of each has the round's writes (one
/// replica cut off holds back every write). When a master dies, here the node the store's
/// URL names, the cluster promotes its replica, and the same link connects again through
/// the other nodes it saw, each flow granted again with its last acknowledged write: none
/// is lost. Writes go on once the dead node is back, as the promoted master's replica.
#[test]
fn on_a_cluster_wait_holds_writes_for_every_masters_replica_and_a_failover_loses_none() {
    let mut servers = RedisServer::cluster_with_replicas().unwrap();
    let redis = RedisStore::connect(RedisConfig {
        cluster: true,
        wait: Some((1, Duration::from_millis(100))),
        min_lease: Duration::from_millis(100),
        max_lease: Duration::from_secs(60),
        ..RedisConfig::new(&servers[0].url())
    })
    .unwrap();
    let mut link = redis.link::<u32>().unwrap();
    let lease = 60_000 * MS;
    let flows = 30u32;
    let mut epochs = Vec::new();
    for key in 0..flows {
        let acquire = Request::Acquire {
            key,
            lease_ns: lease,
            nonce: 1,
        };
        let Some(Reply::Granted { epoch, .. }) = until_answered(&mut link, acquire) else {
            panic!("flow {key} granted");
        };
        epochs.push(epoch);
    }
    let write = |key: u32, seq: u64| Request::Write {
        key,
        epoch: epochs[key as usize],
        seq,
        value: format!("{key}:{seq}").into_bytes(),
        lease_ns: lease,
        keep_ns: KEEP_FOREVER,
        alias: None,
    };
    for key in 0..flows {
        let answer = until_answered(&mut link, write(key, 1));
        assert!(
            matches!(answer, Some(Reply::Written { seq: 1, .. })),
            "flow {key}: {answer:?}"
        );
    }
    for master in &servers[..3] {
        let keys: usize = master.cli(&["dbsize"]).trim().parse().unwrap();
        assert!(keys > 0, "each master holds some of the flows");
    }
    // Every master has its one replica (replicas, with none of their own, are not asked).
    let cluster = redis::cluster::ClusterClient::new(vec![servers[0].url()]).unwrap();
    let mut conn = cluster.get_connection().unwrap();
    let url = servers[0].url();
    assert_eq!(redis_client::short_of_replicas(&mut conn, &url, 1), None);
    let said = redis_client::short_of_replicas(&mut conn, &url, 2);
    assert!(
        (said.as_deref()).is_some_and(|s| s.contains("1 replica(s) connected")),
        "{said:?}"
    );
    // The replica of the second master cut off: no write is acknowledged, whichever
    // master has it (WAIT answers the fewest replicas of any master).
    servers[4].pause().unwrap();
    assert_eq!(
        servers[1]
            .cli(&["client", "kill", "type", "replica"])
            .trim(),
        "1"
    );
    let short = link.counters().short_of_replicas;
    assert_eq!(ask(&mut link, A, write(0, 2)), None, "held back");
    assert!(link.counters().short_of_replicas > short);
    servers[4].resume().unwrap();
    let answer = until_answered(&mut link, write(0, 2));
    assert!(
        matches!(answer, Some(Reply::Written { seq: 2, .. })),
        "{answer:?}"
    );
    // The replicas have everything acknowledged: the URL's node dies.
    for master in &servers[..3] {
        assert_eq!(master.cli(&["wait", "1", "5000"]).trim(), "1");
    }
    servers[0].kill();
    let last_seq = |key: u32| if key == 0 { 2 } else { 1 };
    for key in 0..flows {
        let seq = last_seq(key);
        let again = until_answered(
            &mut link,
            Request::Acquire {
                key,
                lease_ns: lease,
                nonce: 2,
            },
        );
        let expected = format!("{key}:{seq}").into_bytes();
        assert!(
            matches!(&again, Some(Reply::Granted { seq: s, value: Some(v), .. })
                if *s == seq && *v == expected),
            "flow {key}: {again:?} {:?}",
            link.counters()
        );
    }
    assert!(link.counters().reconnects >= 1, "{:?}", link.counters());
    assert!(servers[3].cli(&["role"]).starts_with("master"));
    // The promoted master has no replica yet: writes are held back until the dead node
    // comes back, as its replica.
    assert_eq!(ask(&mut link, A, write(1, 2)), None);
    servers[0].restart().unwrap();
    for key in 0..flows {
        let seq = last_seq(key) + 1;
        let answer = until_answered(&mut link, write(key, seq));
        assert!(
            matches!(answer, Some(Reply::Written { seq: s, .. }) if s == seq),
            "flow {key}: {answer:?}"
        );
    }
    assert!(servers[0].cli(&["role"]).starts_with("slave"));
}

/// The TLS settings of a store at `url`: trusting the PKI's `ca` (none: the system's
/// roots), showing its certificate `client` (with its key) if given.
fn tls_of(pki: &TestPki, url: &str, ca: Option<&str>, client: Option<&str>) -> Option<RedisTls> {
    let ca = ca.map(|name| pki.path(name));
    let (cert, key) = (
        client.map(|c| pki.path(&format!("{c}.pem"))),
        client.map(|c| pki.path(&format!("{c}.key"))),
    );
    let files = TlsFiles {
        ca: ca.as_deref().map(|p| ("replication.tls_ca", p)),
        cert: cert.as_deref().map(|p| ("replication.tls_cert", p)),
        key: key.as_deref().map(|p| ("replication.tls_key", p)),
    };
    RedisTls::load(url, "replication.store", files).unwrap()
}

/// Redis over TLS (`rediss://`): the store takes a lease through a server that asks
/// clients for certificates when it trusts the CA it is given and shows a certificate
/// that CA signed; every other way is refused at start with its cause and its fix.
#[test]
fn over_tls_the_store_trusts_only_the_ca_it_is_given_and_shows_its_certificate() {
    let pki = TestPki::new("redis-store").unwrap();
    let files = pki.server_files();
    let server = RedisServer::start_tls(free_port(), free_port(), &files, true).unwrap();
    let url = server.tls_url().unwrap();
    let connect = |url: &str, tls: Option<RedisTls>| {
        RedisStore::connect(RedisConfig {
            tls,
            ..RedisConfig::new(url)
        })
    };
    let redis = connect(&url, tls_of(&pki, &url, Some("ca.pem"), Some("client"))).unwrap();
    let mut link = redis.link::<u128>().unwrap();
    assert!(matches!(
        ask(&mut link, A, acquire(7, 1)),
        Some(Reply::Granted { epoch: 1, .. })
    ));
    // What the server holds came over TLS: its plain port shows the record.
    assert!(server.cli(&["dbsize"]).trim().parse::<u64>().unwrap() >= 1);

    let refused = |tls: Option<RedisTls>, url: &str| connect(url, tls).err().unwrap();
    // The system's roots, or another CA: the server's certificate is not trusted.
    for ca in [None, Some("other-ca.pem")] {
        let err = refused(tls_of(&pki, &url, ca, Some("client")), &url);
        assert!(
            err.contains("not one this side trusts") && err.contains("replication.tls_ca"),
            "{ca:?}: {err}"
        );
    }
    let err = refused(tls_of(&pki, &url, Some("ca.pem"), None), &url);
    assert!(err.contains("tls-auth-clients"), "{err}");
    let err = refused(tls_of(&pki, &url, Some("ca.pem"), Some("intruder")), &url);
    assert!(
        err.contains("does not trust this side's certificate"),
        "{err}"
    );
    // The TLS port without TLS, and TLS to the plain port.
    let plain_to_tls = url.replace("rediss://", "redis://");
    let err = refused(None, &plain_to_tls);
    assert!(err.contains("give a rediss:// URL"), "{err}");
    let tls_to_plain = format!("rediss://127.0.0.1:{}/", server.port());
    let err = refused(
        tls_of(&pki, &tls_to_plain, Some("ca.pem"), Some("client")),
        &tls_to_plain,
    );
    assert!(err.contains("tls-port"), "{err}");
}

/// TLS files that would guard nothing, or half an identity, are refused naming the
/// setting; a file that is not PEM too.
#[test]
fn tls_files_that_would_guard_nothing_or_are_half_given_are_refused() {
    let pki = TestPki::new("redis-files").unwrap();
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key"),
    );
    let load = |url: &str, files: TlsFiles| RedisTls::load(url, "--redis", files);
    let ca_only = TlsFiles {
        ca: Some(("--redis-ca", &ca)),
        ..TlsFiles::default()
    };
    let not_pem = pki.file("not-pem", "hello").unwrap();
    let refusals = [
        (
            "redis://",
            ca_only,
            "--redis-ca: --redis 'redis://127.0.0.1:6379/' does not use TLS",
        ),
        (
            "rediss://",
            TlsFiles {
                cert: Some(("--redis-cert", &cert)),
                ..TlsFiles::default()
            },
            "--redis-cert: a client certificate needs its key",
        ),
        (
            "rediss://",
            TlsFiles {
                key: Some(("--redis-key", &key)),
                ..TlsFiles::default()
            },
            "--redis-key: a client key needs its certificate",
        ),
        (
            "rediss://",
            TlsFiles {
                ca: Some(("--redis-ca", &not_pem)),
                ..TlsFiles::default()
            },
            "holds no PEM block",
        ),
    ];
    for (scheme, files, message) in refusals {
        let err = load(&format!("{scheme}127.0.0.1:6379/"), files).unwrap_err();
        assert!(err.contains(message), "{message}: {err}");
    }
    assert!(
        load("rediss://127.0.0.1:6379/", TlsFiles::default())
            .unwrap()
            .is_none()
    );
    assert!(load("rediss://127.0.0.1:6379/", ca_only).unwrap().is_some());
}

/// A Redis Cluster over TLS (its masters' links too): the store finds every master
/// through the node it is given, over TLS, and the flows spread over the three.
#[test]
fn a_cluster_over_tls_takes_every_flow_over_its_three_masters() {
    let pki = TestPki::new("redis-cluster-tls").unwrap();
    let files = pki.server_files();
    let servers = RedisServer::tls_cluster(&files).unwrap();
    let url = servers[0].tls_url().unwrap();
    let redis = RedisStore::connect(RedisConfig {
        cluster: true,
        tls: tls_of(&pki, &url, Some("ca.pem"), None),
        ..RedisConfig::new(&url)
    })
    .unwrap();
    let mut link = redis.link::<u32>().unwrap();
    let out = acquire_many(&mut link, 300);
    assert_eq!(out.len(), 300, "{:?}", link.counters());
    assert!(
        out.iter().all(|r| matches!(r, Reply::Granted { .. })),
        "{out:?}"
    );
    for server in &servers {
        let keys: usize = server.cli(&["dbsize"]).trim().parse().unwrap();
        assert!(keys > 30, "a master holds {keys} of the flows");
    }
    let err = RedisStore::connect(RedisConfig {
        cluster: true,
        ..RedisConfig::new(&url)
    })
    .err()
    .unwrap();
    assert!(err.contains("replication.tls_ca"), "{err}");
}

/// A server that asks for a password: the store connects with the one in its URL (the
/// default user's, or an ACL user's), and a missing or refused one is said so, never
/// shown.
#[test]
fn a_password_comes_in_the_url_and_a_refused_one_is_said_so_and_never_shown() {
    let server = RedisServer::start(free_port(), false).unwrap();
    let port = server.port();
    server.cli(&[
        "acl",
        "setuser",
        "app",
        "on",
        ">app-pass-1",
        "~*",
        "&*",
        "+@all",
    ]);
    server.cli(&["config", "set", "requirepass", "s3cret-pass"]);
    for url in [
        format!("redis://:s3cret-pass@127.0.0.1:{port}/"),
        format!("redis://app:app-pass-1@127.0.0.1:{port}/"),
    ] {
        let redis = RedisStore::connect(RedisConfig::new(&url)).unwrap();
        let mut link = redis.link::<u128>().unwrap();
        assert!(
            matches!(
                ask(&mut link, A, acquire(1, 1)),
                Some(Reply::Granted { .. })
            ),
            "{url}"
        );
    }
    let err = RedisStore::connect(RedisConfig::new(&format!(
        "redis://:not-it@127.0.0.1:{port}/"
    )))
    .err()
    .unwrap();
    assert!(
        err.contains("refused the password") && !err.contains("not-it"),
        "{err}"
    );
    let err = RedisStore::connect(RedisConfig::new(&format!("redis://127.0.0.1:{port}/")))
        .err()
        .unwrap();
    assert!(err.contains("asks for a password"), "{err}");
}

/// Switches of two stateplane versions cannot share a store. Functions of a newer version
/// are left in place and a switch of this one refused, saying so; an older version's, and
/// those from before versions were named, are replaced. A link whose functions a newer
/// switch replaces while it runs finds none of its own at its next call, is cut off (its
/// requests go unanswered, counted) and, connecting again, leaves the newer ones there.
#[test]
fn functions_of_another_version_are_replaced_only_when_older() {
    let server = RedisServer::start(free_port(), false).unwrap();
    let ours = format!("local VERSION = {VERSION}\n");
    assert!(
        FUNCTIONS.contains(&ours),
        "the functions' version is VERSION"
    );
    let newer = FUNCTIONS.replace(&ours, &format!("local VERSION = {}\n", VERSION + 1));
    let older = FUNCTIONS.replace(&ours, &format!("local VERSION = {}\n", VERSION - 1));
    // Before versions were named: the steps' names without one, no `stateplane_version`.
    let versioned_names = "local prefix = 'stateplane_v' .. VERSION .. '_'";
    let version_function = FUNCTIONS.find("redis.register_function{").unwrap();
    let unversioned =
        FUNCTIONS[..version_function].replace(versioned_names, "local prefix = 'stateplane_'");
    assert!(FUNCTIONS.contains(versioned_names));
    let load = |functions: &str| {
        let answer = server.cli(&["FUNCTION", "LOAD", "REPLACE", functions]);
        assert_eq!(answer.trim(), "stateplane_replication", "{answer}");
    };
    let loaded = || {
        server
            .cli(&["FCALL", "stateplane_version", "0"])
            .trim()
            .to_string()
    };

    load(&newer);
    let refused = RedisStore::connect(redis_config(&server)).err().unwrap();
    assert!(
        refused.contains(&format!("a newer stateplane (version {}", VERSION + 1))
            && refused.contains("cannot share a store"),
        "{refused}"
    );
    assert_eq!(loaded(), (VERSION + 1).to_string(), "left in place");

    for (replaced, version) in [
        (&older, (VERSION - 1).to_string()),
        (&unversioned, "ERR Function not found".to_string()),
    ] {
        load(replaced);
        assert_eq!(loaded(), version);
        RedisStore::connect(redis_config(&server)).unwrap();
        assert_eq!(loaded(), VERSION.to_string());
    }

    let redis = RedisStore::connect(redis_config(&server)).unwrap();
    let mut link = redis.link::<u32>().unwrap();
    assert!(matches!(
        ask(&mut link, A, acquire_u32(1)),
        Some(Reply::Granted { .. })
    ));
    load(&newer);
    assert_eq!(ask(&mut link, A, acquire_u32(2)), None);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(ask(&mut link, A, acquire_u32(3)), None);
    let counters = link.counters();
    assert!(
        counters.errors >= 2 && counters.connected == 0,
        "{counters:?}"
    );
    assert_eq!(
        loaded(),
        (VERSION + 1).to_string(),
        "still the newer version's"
    );
}
