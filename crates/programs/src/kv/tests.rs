use super::*;
use crate::testutil::{hasher, ipv4_checksums_valid, run_at};
use stateplane_gen::build::L4;
use stateplane_gen::{GenConfig, Workload};
use std::collections::HashMap;

const SERVER: &str = "198.19.0.100";

fn kv(extra: &str) -> Kv {
    let names = PortNames(vec!["clients".into(), "server".into()]);
    let cfg: KvConfig = toml::from_str(&format!("server = \"{SERVER}\"\n{extra}")).unwrap();
    Kv::new(&cfg, &names, "program.kv", 4).unwrap()
}

/// A message between `client` (port 5000) and the server, as a frame.
fn frame(client: &str, to_server: bool, m: &Message) -> Vec<u8> {
    let mut payload = Vec::new();
    m.emit(&mut payload);
    let (src, dst, src_port, dst_port) = if to_server {
        (client, SERVER, 5000, kv::PORT)
    } else {
        (SERVER, client, kv::PORT, 5000)
    };
    let l4 = L4::Udp { src_port, dst_port };
    crate::testutil::ip_frame_with(src, dst, l4, &payload)
}

fn msg(op: Op, key: u64, value: &[u8]) -> Message<'_> {
    Message {
        op,
        request_id: 77,
        key,
        value,
    }
}

#[test]
fn a_get_of_a_put_key_is_answered_by_the_data_plane_with_the_value() {
    let mut p = kv("");
    let put = frame("198.18.0.1", true, &msg(Op::Put, 42, b"sixteen bytes!!!"));
    let get = frame("198.18.0.9", true, &msg(Op::Get, 42, b""));
    let out = run_at(&mut p, 1, &[(put, 0), (get.clone(), 0)], (0, 1), 2);
    assert_eq!(
        out[0].0,
        Verdict::Forward(1),
        "the PUT goes on to the server"
    );
    assert_eq!(
        out[1].0,
        Verdict::Forward(0),
        "the GET is answered back where it came from"
    );
    let reply = &out[1].1;
    assert!(
        ipv4_checksums_valid(reply),
        "IPv4 and UDP checksums of the reply"
    );
    let r = stateplane_wire::parse(reply, 0, &hasher()).unwrap();
    let g = stateplane_wire::parse(&get, 0, &hasher()).unwrap();
    assert_eq!(r.key, g.key.reversed(), "addresses and ports swapped");
    assert_eq!(reply[..6], get[6..12], "to the client's MAC");
    let m = Message::parse(&reply[usize::from(r.payload_offset)..]).unwrap();
    assert_eq!(m, msg(Op::GetReply, 42, b"sixteen bytes!!!"));
    assert_eq!(p.answered, 1);
}

#[test]
fn long_values_and_misses_go_to_the_server_and_replies_fill_the_cache() {
    let mut p = kv("");
    let long = [7u8; 40];
    let frames = [
        (frame("198.18.0.1", true, &msg(Op::Put, 1, b"short")), 0),
        (frame("198.18.0.1", true, &msg(Op::Put, 1, &long)), 0),
        (frame("198.18.0.2", true, &msg(Op::Get, 1, b"")), 0),
        (
            frame(
                "198.18.0.2",
                false,
                &msg(Op::GetReply, 2, b"from the server"),
            ),
            1,
        ),
        (frame("198.18.0.3", true, &msg(Op::Get, 2, b"")), 0),
    ];
    let out = run_at(&mut p, 1, &frames, (0, 1), 2);
    let verdicts: Vec<Verdict> = out.iter().map(|o| o.0).collect();
    assert_eq!(
        verdicts,
        [
            Verdict::Forward(1),
            Verdict::Forward(1),
            Verdict::Forward(1), // a 40-byte value removed the key: a miss
            Verdict::Forward(0), // the server's reply goes to the client
            Verdict::Forward(0), // and filled the cache
        ]
    );
    assert_eq!(p.cached(1), None);
    assert_eq!(p.cached(2).as_deref(), Some(&b"from the server"[..]));
}

#[test]
fn on_the_kv_workload_every_answer_is_the_last_value_put() {
    let mut cfg = GenConfig::new(Workload::Kv, 30_000);
    cfg.ipv6_share = 0.3;
    cfg.kv_keys = 500;
    let frames = crate::testutil::generated(&cfg);
    // The server is IPv4 only here: IPv6 requests go to another server and pass.
    let mut p = kv("");
    let mut last: HashMap<u64, Vec<u8>> = HashMap::new();
    let (mut answered, mut passed) = (0, 0);
    for chunk in frames.chunks(64) {
        let out = run_at(&mut p, 1, chunk, (0, 1), 2);
        for ((before, _), (verdict, after)) in chunk.iter().zip(out) {
            let b = stateplane_wire::parse(before, 0, &hasher()).unwrap();
            let m = Message::parse(&before[usize::from(b.payload_offset)..]).unwrap();
            match verdict {
                Verdict::Forward(0) => {
                    let a = stateplane_wire::parse(&after, 0, &hasher()).unwrap();
                    let r = Message::parse(&after[usize::from(a.payload_offset)..]).unwrap();
                    assert_eq!(
                        (r.op, r.key, r.request_id),
                        (Op::GetReply, m.key, m.request_id)
                    );
                    assert_eq!(
                        Some(r.value),
                        last.get(&m.key).map(|v| &v[..]),
                        "never stale"
                    );
                    if b.key.ip_version == 4 {
                        assert!(ipv4_checksums_valid(&after));
                    }
                    answered += 1;
                }
                Verdict::Forward(1) => passed += 1,
                other => panic!("{other:?}"),
            }
            if m.op == Op::Put && b.key.ip_version == 4 {
                last.insert(m.key, m.value.to_vec());
            }
        }
    }
    assert!(
        answered > 10_000,
        "most GETs of popular keys are answered: {answered}"
    );
    assert!(passed > 3_000, "PUTs, misses and IPv6 pass: {passed}");
}

/// Synced, a switch's cache moves into another (another hash seed, so other slots): there
/// a GET of a key PUT through the first, or filled by the server's reply, is answered by
/// the data plane with the value last seen, and a key never seen goes on to the server.
#[test]
fn a_synced_cache_moves_to_another_switch_and_answers_there() {
    // A slot: action, key, length, value (128 bits: two words).
    let stride = 1 + 1 + 1 + 2;
    let mut a = kv("capacity = 64");
    let slots = a.cache.slot_count() as u32;
    assert_eq!(a.track("cache", 0), Some(slots * stride));
    let frames = [
        (frame("198.18.0.1", true, &msg(Op::Put, 42, b"first")), 0),
        (
            frame("198.18.0.1", true, &msg(Op::Put, 42, b"sixteen bytes!!!")),
            0,
        ),
        (
            frame(
                "198.18.0.2",
                false,
                &msg(Op::GetReply, 9, b"from the server"),
            ),
            1,
        ),
    ];
    run_at(&mut a, 1, &frames, (0, 1), 2);
    let mut b = Kv::new(
        &toml::from_str(&format!("server = \"{SERVER}\"\ncapacity = 64")).unwrap(),
        &PortNames(vec!["clients".into(), "server".into()]),
        "program.kv",
        77,
    )
    .unwrap();
    assert_eq!(b.track("cache", 0), Some(slots * stride));
    assert_eq!(
        crate::testutil::move_synced_table(&mut a, &mut b, stride),
        (2, 0)
    );
    let gets = [42, 9, 5].map(|key| (frame("198.18.0.3", true, &msg(Op::Get, key, b"")), 0));
    let out = run_at(&mut b, 2, &gets, (0, 1), 2);
    let verdicts: Vec<Verdict> = out.iter().map(|(v, _)| *v).collect();
    assert_eq!(
        verdicts,
        [
            Verdict::Forward(0),
            Verdict::Forward(0),
            Verdict::Forward(1)
        ]
    );
    let value = |reply: &[u8]| {
        let r = stateplane_wire::parse(reply, 0, &hasher()).unwrap();
        Message::parse(&reply[usize::from(r.payload_offset)..])
            .unwrap()
            .value
            .to_vec()
    };
    assert_eq!(value(&out[0].1), b"sixteen bytes!!!");
    assert_eq!(value(&out[1].1), b"from the server");
}

#[test]
fn bad_settings_name_the_field() {
    let names = PortNames(vec!["a".into(), "b".into()]);
    let err = |text: &str| {
        let cfg: KvConfig = toml::from_str(text).unwrap();
        Kv::new(&cfg, &names, "program.kv", 1)
            .err()
            .map(|e| e.field)
    };
    assert_eq!(
        err("server = \"nope\"").as_deref(),
        Some("program.kv.server")
    );
    assert_eq!(
        err("server = \"198.19.0.100\"\nidle = 0").as_deref(),
        Some("program.kv.idle")
    );
    assert_eq!(
        err("server = \"198.19.0.100\"\ncapacity = 0").as_deref(),
        Some("program.kv.capacity")
    );
}

/// Replicated, the cache is kept per key: a PUT, a GET and the server's GET_REPLY of one
/// key share its flow whoever sends them; a PUT changes the key's state, a GET only reads
/// it; installed on another switch, the state answers that switch's GETs.
#[test]
fn a_replicated_cache_keeps_each_key_as_a_flow_and_answers_from_another_switch() {
    let mut a = kv("");
    assert!(a.replicate("cache"));
    let key_of = |p: &Kv, f: &[u8], port: PortId| {
        let mut b = Burst::with_capacity(1);
        b.push(f, f.len() as u32, 1, port, 0);
        b.parse(&hasher());
        p.replicated_key(&b.descs()[0], b.data(0))
    };
    let put = frame("198.18.0.1", true, &msg(Op::Put, 42, b"value"));
    let get = frame("198.18.0.9", true, &msg(Op::Get, 42, b""));
    let reply = frame("198.18.0.9", false, &msg(Op::GetReply, 42, b"value"));
    let key = key_of(&a, &put, 0).unwrap();
    assert_eq!(key_of(&a, &get, 0), Some(key));
    assert_eq!(key_of(&a, &reply, 1), Some(key));
    assert_ne!(
        key_of(&a, &frame("198.18.0.1", true, &msg(Op::Get, 43, b"")), 0),
        Some(key)
    );
    let not_kv = crate::testutil::ip_frame_with(
        "198.18.0.1",
        SERVER,
        L4::Udp {
            src_port: 5000,
            dst_port: 53,
        },
        b"",
    );
    assert_eq!(key_of(&a, &not_kv, 0), None);

    run_at(&mut a, 1, &[(put, 0)], (0, 1), 2);
    let cached = a.replicated_state(&key).unwrap();
    run_at(&mut a, 2, &[(get.clone(), 0)], (0, 1), 2);
    assert_eq!(
        a.replicated_state(&key),
        Some(cached.clone()),
        "a GET reads"
    );

    let mut b = kv("");
    assert!(b.replicate("cache"));
    assert_eq!(
        run_at(&mut b, 3, &[(get.clone(), 0)], (0, 1), 2)[0].0,
        Verdict::Forward(1)
    );
    assert!(b.install_replicated(&key, Some(&cached), 3));
    let out = run_at(&mut b, 4, &[(get, 0)], (0, 1), 2);
    assert_eq!(
        out[0].0,
        Verdict::Forward(0),
        "answered from the installed value"
    );
    assert_eq!(b.cached(42), Some(b"value".to_vec()));
}
