use super::*;
use crate::testutil::{ctx, hasher, ip_frame, ipv4_checksums_valid, run_at, tcp};
use stateplane_gen::build::L4;
use stateplane_wire::parse;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

const S: u64 = 1_000_000_000;
const VIP: &str = "198.19.0.10";
const DNS_VIP: &str = "198.19.0.11";
const CONFIG: &str = r#"
clients = "clients"
servers = "s1"
[[vips]]
address = "198.19.0.10"
port = 80
backends = [
  { address = "198.18.1.1", mac = "02:00:00:00:0b:01" },
  { address = "198.18.1.2", via = "s2" },
  { address = "198.18.1.3", port = 8080 },
]
[[vips]]
address = "198.19.0.11"
port = 53
proto = "udp"
affinity = "client"
backends = [{ address = "198.18.1.1" }, { address = "198.18.1.2" }]
"#;

fn names() -> PortNames {
    PortNames(vec!["clients".into(), "s1".into(), "s2".into()])
}

fn lb_with(config: &str) -> Result<Lb, ConfigError> {
    let cfg: LbConfig =
        toml::from_str(config).map_err(|e| ConfigError::new("toml", e.message()))?;
    Lb::new(&cfg, &names(), "program.lb", 3)
}

fn lb() -> Lb {
    lb_with(CONFIG).unwrap()
}

/// The destination (address, port) of a frame, its output port, and its destination MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Sent {
    to: (IpAddr, u16),
    via: PortId,
    mac: [u8; 6],
}

/// Runs frames from the clients' port through `lb` at time `t`; where each went.
fn send(lb: &mut Lb, t: u64, frames: &[Vec<u8>]) -> Vec<Option<Sent>> {
    let on_clients: Vec<(Vec<u8>, PortId)> = frames.iter().map(|f| (f.clone(), 0)).collect();
    run_at(lb, t, &on_clients, (0, 1), 3)
        .into_iter()
        .map(|(v, bytes)| {
            let Verdict::Forward(via) = v else {
                return None;
            };
            assert!(ipv4_checksums_valid(&bytes), "checksums after rewriting");
            let key = parse(&bytes, 0, &hasher()).unwrap().key;
            let mut mac = [0; 6];
            mac.copy_from_slice(&bytes[..6]);
            Some(Sent {
                to: (key.dst_ip().unwrap(), key.dst_port),
                via,
                mac,
            })
        })
        .collect()
}

/// The verdict of one frame from `port`.
fn verdict(lb: &mut Lb, frame: Vec<u8>, port: PortId) -> Verdict {
    run_at(lb, S, &[(frame, port)], (0, 1), 3)[0].0
}

/// Connection `i`'s packet to the web VIP, with these TCP flags.
fn web(i: u32, f: u8) -> Vec<u8> {
    let client = format!("198.18.{}.{}", 2 + i / 250, 1 + i % 250);
    ip_frame(&client, VIP, tcp(30_000 + (i % 7) as u16, 80, f))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Applies writes to `backends` as the runtime does: checked against the declaration,
/// prepared on an instance of its own, then taken by each worker.
fn change(workers: &mut [&mut Lb], preparer: &Lb, writes: Vec<Write>) {
    let request = Request::Write {
        table: "backends".into(),
        writes,
    };
    preparer.declarations()[1].check(&request).unwrap();
    let prepared = preparer.prepare(&request).unwrap();
    for lb in workers {
        let reply = lb.control(&request, prepared.as_ref(), &ctx(S, 3));
        assert_eq!(reply, Ok(Reply::Done));
    }
}

/// Marks backends up or down through the control plane.
fn set_health(workers: &mut [&mut Lb], preparer: &Lb, changes: &[(&str, u16, u8, bool)]) {
    change(workers, preparer, health(preparer, changes));
}

/// Modifies marking these backends up or down, their other settings as they are.
fn health(lb: &Lb, changes: &[(&str, u16, u8, bool)]) -> Vec<Write> {
    changes
        .iter()
        .map(|&(address, port, proto, up)| {
            let mut entry = current(lb, address, port, proto);
            entry.action = if up { "up" } else { "down" }.into();
            Write::Modify(entry)
        })
        .collect()
}

/// A backend's entry as the newest pools hold it.
fn current(lb: &Lb, address: &str, port: u16, proto: u8) -> Entry {
    let pools = lb.newest.lock().unwrap();
    let b = pools.place(&backend_fields(address, port, proto)).unwrap();
    pools.entry(&pools.backends[b])
}

fn backend_fields(address: &str, port: u16, proto: u8) -> Vec<Match> {
    let a: std::net::Ipv4Addr = address.parse().unwrap();
    vec![
        Match::Exact(u128::from(u32::from(a))),
        Match::Exact(u128::from(port)),
        Match::Exact(u128::from(proto)),
    ]
}

const SYN: u8 = flags::SYN;
const ACK: u8 = flags::ACK;

#[test]
fn every_packet_of_a_connection_reaches_one_backend_and_answers_leave_from_the_vip() {
    let mut lb = lb();
    let n = 600;
    let opened = send(&mut lb, S, &(0..n).map(|i| web(i, SYN)).collect::<Vec<_>>());
    let mut per_backend: BTreeMap<(IpAddr, u16), u32> = BTreeMap::new();
    for sent in &opened {
        let sent = sent.expect("every connection is balanced");
        *per_backend.entry(sent.to).or_default() += 1;
        let (via, mac) = match sent.to {
            (a, 80) if a == ip("198.18.1.1") => (1, [2, 0, 0, 0, 0x0b, 1]),
            (a, 80) if a == ip("198.18.1.2") => (2, [2, 0, 0, 0, 0, 2]),
            (a, 8080) if a == ip("198.18.1.3") => (1, [2, 0, 0, 0, 0, 2]),
            other => panic!("{other:?} is not a backend of the VIP"),
        };
        assert_eq!((sent.via, sent.mac), (via, mac), "{sent:?}");
    }
    // Maglev gives each backend a third of the slots; 600 connections land near 200 each.
    assert_eq!(per_backend.len(), 3, "{per_backend:?}");
    assert!(per_backend.values().all(|&c| c > 120), "{per_backend:?}");
    assert_eq!((lb.created, lb.len()), (u64::from(n), n as usize));
    // Later packets, in another order and another burst, follow their connection.
    let later: Vec<u32> = (0..n).rev().collect();
    let again = send(
        &mut lb,
        2 * S,
        &later.iter().map(|&i| web(i, ACK)).collect::<Vec<_>>(),
    );
    for (&i, sent) in later.iter().zip(&again) {
        assert_eq!(*sent, opened[i as usize], "connection {i}");
    }
    let key = parse(&web(5, ACK), 0, &hasher()).unwrap().key;
    assert_eq!(lb.affinity_of(&key).map(|a| a.packets), Some(2));
    // The backend's answer leaves for the client from the VIP, checksums right.
    let to = opened[5].unwrap().to;
    let answer = ip_frame(
        &to.0.to_string(),
        "198.18.2.6",
        tcp(to.1, 30_005, SYN | ACK),
    );
    let (v, bytes) = run_at(
        &mut lb,
        3 * S,
        &[(answer, opened[5].unwrap().via)],
        (0, 1),
        3,
    )
    .remove(0);
    assert_eq!(v, Verdict::Forward(0));
    assert!(ipv4_checksums_valid(&bytes));
    let back = parse(&bytes, 0, &hasher()).unwrap().key;
    assert_eq!(
        back,
        FlowKey { in_port: 0, ..key }.reversed(),
        "the client's tuple, reversed"
    );
}

#[test]
fn a_backend_going_down_moves_only_its_connections_and_up_again_takes_new_ones() {
    let mut worker = lb();
    let preparer = worker.clone();
    let n = 600;
    let frames: Vec<Vec<u8>> = (0..n).map(|i| web(i, SYN)).collect();
    let before = send(&mut worker, S, &frames);
    let on_down = |s: &Option<Sent>| s.unwrap().to == (ip("198.18.1.2"), 80);
    let victims = before.iter().filter(|s| on_down(s)).count();
    assert!(victims > 100, "{victims}");
    set_health(
        &mut [&mut worker],
        &preparer,
        &[("198.18.1.2", 80, 6, false)],
    );
    let acks: Vec<Vec<u8>> = (0..n).map(|i| web(i, ACK)).collect();
    let after = send(&mut worker, 2 * S, &acks);
    for (b, a) in before.iter().zip(&after) {
        if on_down(b) {
            assert!(!on_down(a), "moved off the backend that went down");
        } else {
            assert_eq!(a, b, "a connection of a backend still up stays");
        }
    }
    assert_eq!(worker.moved, victims as u64);
    // New connections avoid it; when it is up again, new connections reach it while the
    // connections that moved stay where they went.
    let new: Vec<Vec<u8>> = (n..2 * n).map(|i| web(i, SYN)).collect();
    assert!(!send(&mut worker, 3 * S, &new).iter().any(on_down));
    set_health(
        &mut [&mut worker],
        &preparer,
        &[("198.18.1.2", 80, 6, true)],
    );
    assert_eq!(send(&mut worker, 4 * S, &acks), after);
    let newer: Vec<Vec<u8>> = (2 * n..3 * n).map(|i| web(i, SYN)).collect();
    assert!(
        send(&mut worker, 4 * S, &newer)
            .iter()
            .filter(|s| on_down(s))
            .count()
            > 100
    );
}

#[test]
fn every_worker_and_every_restart_picks_the_same_backend() {
    let frames: Vec<Vec<u8>> = (0..200).map(|i| web(i, SYN)).collect();
    let first = send(&mut lb(), S, &frames);
    // Another switch's instance, with the table's seed drawn anew.
    let cfg: LbConfig = toml::from_str(CONFIG).unwrap();
    let mut other = Lb::new(&cfg, &names(), "program.lb", 12_345).unwrap();
    assert_eq!(send(&mut other, S, &frames), first);
}

#[test]
fn client_affinity_sends_each_client_to_one_backend() {
    let mut lb = lb();
    let mut backends_of: BTreeMap<u32, BTreeSet<IpAddr>> = BTreeMap::new();
    for client in 0..40u32 {
        let src = format!("198.18.3.{}", client + 1);
        let frames: Vec<Vec<u8>> = (0..8)
            .map(|p| {
                let l4 = L4::Udp {
                    src_port: 5000 + p,
                    dst_port: 53,
                };
                ip_frame(&src, DNS_VIP, l4)
            })
            .collect();
        for sent in send(&mut lb, S, &frames) {
            let sent = sent.expect("balanced");
            assert_eq!(sent.to.1, 53);
            backends_of.entry(client).or_default().insert(sent.to.0);
        }
    }
    assert!(
        backends_of.values().all(|b| b.len() == 1),
        "{backends_of:?}"
    );
    let used: BTreeSet<&IpAddr> = backends_of.values().flatten().collect();
    assert_eq!(used.len(), 2, "both backends serve some clients");
}

#[test]
fn drops_say_why_and_arp_passes() {
    let mut lb = lb();
    let reason = |lb: &Lb, v: Verdict| match v {
        Verdict::Drop(r) => r.name(lb.drop_reasons()),
        other => panic!("{other:?} is not a drop"),
    };
    let v = verdict(
        &mut lb,
        ip_frame("198.18.2.1", "198.19.0.99", tcp(1, 80, SYN)),
        0,
    );
    assert_eq!(reason(&lb, v), "no_vip", "an address that is no VIP");
    let v = verdict(&mut lb, ip_frame("198.18.2.1", VIP, tcp(1, 81, SYN)), 0);
    assert_eq!(reason(&lb, v), "no_vip", "a port that is no VIP's");
    let udp = L4::Udp {
        src_port: 1,
        dst_port: 80,
    };
    let v = verdict(&mut lb, ip_frame("198.18.2.1", VIP, udp), 0);
    assert_eq!(reason(&lb, v), "no_vip", "the VIP is TCP");
    let v = verdict(
        &mut lb,
        ip_frame("198.18.9.9", "198.18.2.1", tcp(80, 1, ACK)),
        1,
    );
    assert_eq!(reason(&lb, v), "not_backend");
    let v = verdict(
        &mut lb,
        ip_frame("198.18.1.3", "198.18.2.1", tcp(80, 1, ACK)),
        1,
    );
    assert_eq!(
        reason(&lb, v),
        "not_backend",
        "that backend serves port 8080"
    );
    let mut arp = vec![0u8; 42];
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    assert_eq!(verdict(&mut lb, arp.clone(), 0), Verdict::Flood);
    assert_eq!(verdict(&mut lb, arp, 2), Verdict::Forward(0));
    // With every backend down, the VIP has nowhere to send.
    let preparer = lb.clone();
    let all_down = [
        ("198.18.1.1", 80, 6, false),
        ("198.18.1.2", 80, 6, false),
        ("198.18.1.3", 8080, 6, false),
    ];
    set_health(&mut [&mut lb], &preparer, &all_down);
    let v = verdict(&mut lb, web(1, SYN), 0);
    assert_eq!(reason(&lb, v), "no_backend");
    // A full affinity table of established connections refuses new ones and keeps the
    // ones it has.
    let mut small = lb_with(&format!("capacity = 2\n{CONFIG}")).unwrap();
    let sent = send(
        &mut small,
        S,
        &[web(1, SYN), web(2, SYN), web(1, ACK), web(2, ACK)],
    );
    assert!(sent.iter().all(Option::is_some));
    let v = verdict(&mut small, web(3, SYN), 0);
    assert_eq!(reason(&small, v), "table_full");
    assert!(send(&mut small, S, &[web(1, ACK)])[0].is_some());
}

/// A SYN flood at a VIP, 10x the affinity table: every established connection keeps its
/// backend, and the flood's SYNs take only the room of unestablished ones.
#[test]
fn a_syn_flood_displaces_only_unestablished_connections() {
    let mut lb = lb_with(&format!("capacity = 64\n{CONFIG}")).unwrap();
    let established: Vec<Sent> = (1..=32u32)
        .map(|i| {
            send(&mut lb, S, &[web(i, SYN)]);
            send(&mut lb, S, &[web(i, ACK)])[0].unwrap()
        })
        .collect();
    let taken = (1_000..1_640u32)
        .filter(|&i| send(&mut lb, 2 * S, &[web(i, SYN)])[0].is_some())
        .count();
    assert!(taken > 600, "{taken} of 640 flood SYNs balanced");
    for (i, before) in (1..=32u32).zip(&established) {
        let key = parse(&web(i, ACK), 0, &hasher()).unwrap().key;
        assert_eq!(
            lb.affinity_of(&key).map(|a| a.state),
            Some(ESTABLISHED),
            "connection {i} kept, established"
        );
        assert_eq!(send(&mut lb, 3 * S, &[web(i, ACK)])[0], Some(*before));
    }
}

#[test]
fn affinities_close_on_fin_go_on_rst_and_time_out() {
    // A small table, so that a few idle sweeps see all of it.
    let mut lb = lb_with(&format!(
        "capacity = 16\ntimeouts = {{ tcp = 10.0, tcp_closing = 2.0, udp = 5.0 }}\n{CONFIG}"
    ))
    .unwrap();
    let key = |f: &Vec<u8>| FlowKey {
        in_port: 0,
        ..parse(f, 0, &hasher()).unwrap().key
    };
    let (a, b, c) = (web(1, SYN), web(2, SYN), web(3, SYN));
    send(&mut lb, S, &[a.clone(), b.clone(), c.clone()]);
    send(
        &mut lb,
        2 * S,
        &[web(1, flags::FIN | ACK), web(2, flags::RST)],
    );
    assert_eq!(lb.affinity_of(&key(&a)).map(|x| x.state), Some(CLOSING));
    assert_eq!(lb.affinity_of(&key(&b)), None, "a reset ends the affinity");
    // Later packets of a closing connection do not restart its timer.
    send(&mut lb, 3 * S, &[web(1, ACK), web(3, ACK)]);
    let idle = |lb: &mut Lb, t: u64| {
        for _ in 0..4 {
            lb.poll(&mut Burst::with_capacity(1), &mut ctx(t, 3));
        }
    };
    idle(&mut lb, 4 * S + 1);
    assert_eq!(lb.affinity_of(&key(&a)), None, "closed 2 s after its FIN");
    assert!(lb.affinity_of(&key(&c)).is_some());
    idle(&mut lb, 13 * S + 1);
    assert_eq!(lb.affinity_of(&key(&c)), None, "idle for 10 s");
    assert!(lb.is_empty());
}

#[test]
fn backends_are_read_and_marked_through_the_control_plane() {
    let mut lb = lb();
    let preparer = lb.clone();
    let c = ctx(S, 3);
    let read = |lb: &mut Lb, key| {
        let request = Request::Read {
            table: "backends".into(),
            key,
            from: 0,
        };
        match lb.control(&request, None, &c).unwrap() {
            Reply::Page(entries, None) => entries,
            other => panic!("{other:?}"),
        }
    };
    let all = read(&mut lb, None);
    assert_eq!(all.len(), 5);
    assert!(all.iter().all(|e| e.action == "up"));
    set_health(&mut [&mut lb], &preparer, &[("198.18.1.3", 8080, 6, false)]);
    let one = read(&mut lb, Some(backend_fields("198.18.1.3", 8080, 6)));
    assert_eq!((one.len(), one[0].action.as_str()), (1, "down"));
    // A batch with a backend that does not exist changes nothing.
    let mut writes = health(&preparer, &[("198.18.1.1", 80, 6, false)]);
    let mut missing = current(&preparer, "198.18.1.1", 80, 6);
    missing.key = backend_fields("198.18.1.9", 80, 6);
    writes.push(Write::Modify(missing));
    let bad = Request::Write {
        table: "backends".into(),
        writes,
    };
    assert!(matches!(
        preparer.prepare(&bad),
        Err(ControlError::NoSuchEntry { .. })
    ));
    let insert = Request::Write {
        table: "backends".into(),
        writes: vec![Write::Insert(read(&mut lb, None)[0].clone())],
    };
    assert!(matches!(
        preparer.prepare(&insert),
        Err(ControlError::Exists { .. })
    ));
    let ups = read(&mut lb, None);
    assert_eq!(ups.iter().filter(|e| e.action == "up").count(), 4);
    // The next change starts from the newest pools, not the worker's.
    set_health(&mut [&mut lb], &preparer, &[("198.18.1.1", 80, 6, false)]);
    assert_eq!(
        read(&mut lb, None)
            .iter()
            .filter(|e| e.action == "up")
            .count(),
        3
    );
    // Worker 1 leaves the shared pools' pages to worker 0.
    let request = Request::Read {
        table: "backends".into(),
        key: None,
        from: 0,
    };
    let c1 = Context {
        worker: 1,
        ..ctx(S, 3)
    };
    assert_eq!(
        lb.control(&request, None, &c1),
        Ok(Reply::Page(Vec::new(), None))
    );
}

#[test]
fn configuration_errors_name_the_field_and_the_fix() {
    let field = |extra: &str| lb_with(extra).err().map(|e| e.field).unwrap_or_default();
    let vip = |backends: &str| {
        format!("[[vips]]\naddress = \"198.19.0.10\"\nport = 80\nbackends = [{backends}]\n")
    };
    assert_eq!(field("vips = []"), "program.lb.vips");
    assert_eq!(
        field(&format!(
            "table_size = 65536\n{}",
            vip("{ address = \"198.18.1.1\" }")
        )),
        "program.lb.table_size"
    );
    assert_eq!(field(&vip("")), "program.lb.vips[0].backends");
    assert_eq!(
        field(&vip("{ address = \"198.18.1\" }")),
        "program.lb.vips[0].backends[0].address"
    );
    assert_eq!(
        field(&vip("{ address = \"198.18.1.1\", via = \"clients\" }")),
        "program.lb.vips[0].backends[0].via"
    );
    assert_eq!(
        field(&vip("{ address = \"198.18.1.1\", mac = \"02:00\" }")),
        "program.lb.vips[0].backends[0].mac"
    );
    assert_eq!(
        field(&vip(
            "{ address = \"198.18.1.1\" }, { address = \"198.18.1.1\" }"
        )),
        "program.lb.vips[0].backends[1]"
    );
    let twice = format!(
        "{}{}",
        vip("{ address = \"198.18.1.1\" }"),
        vip("{ address = \"198.18.1.2\" }")
    );
    assert_eq!(field(&twice), "program.lb.vips[1]");
    let bad_proto = vip("{ address = \"198.18.1.1\" }") + "proto = \"sctp\"\n";
    assert_eq!(field(&bad_proto), "program.lb.vips[0].proto");
    let err = lb_with(&format!(
        "table_size = 100\n{}",
        vip("{ address = \"198.18.1.1\" }")
    ))
    .err()
    .unwrap();
    assert!(err.problem.contains("65537"), "{err}");
    assert_eq!(
        field(&vip("{ address = \"198.18.1.1\", weight = 0 }")),
        "program.lb.vips[0].backends[0].weight"
    );
    let two = vip("{ address = \"198.18.1.1\" }, { address = \"198.18.1.2\" }");
    assert_eq!(
        field(&format!("max_backends = 1\n{two}")),
        "program.lb.max_backends"
    );
    assert_eq!(
        field(&format!("max_backends = 65536\n{two}")),
        "program.lb.max_backends"
    );
}

/// The replicated key of one frame from `port`.
fn replicated_key_of(lb: &Lb, frame: &[u8], port: PortId) -> Option<stateplane_runtime::FlowBytes> {
    let mut b = Burst::with_capacity(1);
    b.push(frame, frame.len() as u32, S, port, 0);
    b.parse(&hasher());
    lb.replicated_key(&b.descs()[0], b.data(0))
}

/// Replicated, a connection's affinity moves to another switch: there its packets reach
/// the backend it was given, even where that switch's pool (one backend more) would pick
/// another. Packets to no VIP and the backends' answers keep no state; a packet of an
/// established connection changes nothing the store keeps (its count stays local).
#[test]
fn a_replicated_affinity_keeps_its_backend_on_a_switch_with_another_pool() {
    let mut a = lb();
    assert!(
        !a.replicate("backends"),
        "shared, from configuration: not per flow"
    );
    assert!(a.replicate("connections"));
    let grown = CONFIG.replace(
        "{ address = \"198.18.1.3\", port = 8080 },",
        "{ address = \"198.18.1.3\", port = 8080 },\n  { address = \"198.18.1.4\" },",
    );
    let mut b = lb_with(&grown).unwrap();
    assert!(b.replicate("connections"));
    let mut moved = 0;
    for i in 0..200 {
        let key = replicated_key_of(&a, &web(i, flags::SYN), 0).unwrap();
        let there = send(&mut a, S, &[web(i, flags::SYN)])[0].unwrap();
        let opened = a.replicated_state(&key).unwrap();
        send(&mut a, S, &[web(i, flags::ACK)]);
        let established = a.replicated_state(&key).unwrap();
        assert_ne!(established, opened, "the handshake's end moves the state");
        send(&mut a, S, &[web(i, flags::ACK)]);
        assert_eq!(
            a.replicated_state(&key).unwrap(),
            established,
            "a count is no change"
        );

        let fresh = send(&mut lb_with(&grown).unwrap(), S, &[web(i, flags::ACK)])[0].unwrap();
        moved += usize::from(fresh != there);
        assert!(b.install_replicated(&key, Some(&established), S));
        assert_eq!(
            send(&mut b, S, &[web(i, flags::ACK)])[0],
            Some(there),
            "{i}"
        );
    }
    assert!(moved > 10, "the grown pool picks anew for {moved} of 200");

    let answer = ip_frame("198.18.1.1", "198.18.2.1", tcp(80, 30_000, flags::ACK));
    assert_eq!(replicated_key_of(&a, &answer, 1), None);
    let nowhere = ip_frame("198.18.2.1", "198.19.0.99", tcp(30_000, 80, flags::SYN));
    assert_eq!(replicated_key_of(&a, &nowhere, 0), None);
}

/// Synced, the connections move into another switch (another hash seed) whose
/// configuration has only the first VIP's first three backends: there each goes on to
/// the backend it had, and one whose backend's place is past the switch's list picks
/// again (counted as moved) rather than failing.
#[test]
fn synced_connections_move_and_one_whose_backend_is_not_there_picks_again() {
    let grown = CONFIG.replace(
        "{ address = \"198.18.1.3\", port = 8080 },",
        "{ address = \"198.18.1.3\", port = 8080 },\n  { address = \"198.18.1.4\" },",
    );
    // A slot: action (the connection's state), key (8 words), backend, packets.
    let stride = 1 + 8 + 2;
    let mut a = lb_with(&grown).unwrap();
    let slots = a.connections.slot_count() as u32;
    assert_eq!(a.track("connections", 0), Some(slots * stride));
    let there: Vec<Sent> = (0..100)
        .map(|i| send(&mut a, S, &[web(i, flags::SYN)])[0].unwrap())
        .collect();
    let web_only = &CONFIG[..CONFIG.find("[[vips]]\naddress = \"198.19.0.11\"").unwrap()];
    let cfg: LbConfig = toml::from_str(web_only).unwrap();
    let mut b = Lb::new(&cfg, &names(), "program.lb", 77).unwrap();
    assert_eq!(b.track("connections", 0), Some(slots * stride));
    assert_eq!(
        crate::testutil::move_synced_table(&mut a, &mut b, stride),
        (100, 0)
    );
    let mut picked_again = 0;
    for (i, was) in (0..).zip(&there) {
        let now = send(&mut b, 2 * S, &[web(i, flags::ACK)])[0].unwrap();
        if was.to.0 == ip("198.18.1.4") {
            assert_ne!(now.to.0, was.to.0, "{i}");
            picked_again += 1;
        } else {
            assert_eq!(now, *was, "{i}");
        }
    }
    assert!(picked_again > 5, "{picked_again} of 100 were on 198.18.1.4");
    assert_eq!(b.moved, picked_again);
}

/// A reload keeps each connection on its backend while the configuration still has
/// that backend (wherever it now sits in the list), drops those whose backend left (their
/// next packet picks again), and keeps the health the control plane gave each backend
/// still configured; what came across is said.
#[test]
fn a_reload_keeps_connections_on_their_backends_and_the_backends_health() {
    let mut old = lb();
    let preparer = old.clone();
    let n = 300;
    let before = send(
        &mut old,
        S,
        &(0..n).map(|i| web(i, SYN)).collect::<Vec<_>>(),
    );
    set_health(
        &mut [&mut old],
        &preparer,
        &[("198.18.1.3", 8080, 6, false)],
    );
    // 198.18.1.1 leaves the web VIP, 198.18.1.4 joins it, and the others swap places.
    let reordered = CONFIG.replace(
        r#"  { address = "198.18.1.1", mac = "02:00:00:00:0b:01" },
  { address = "198.18.1.2", via = "s2" },
  { address = "198.18.1.3", port = 8080 },"#,
        r#"  { address = "198.18.1.3", port = 8080 },
  { address = "198.18.1.4" },
  { address = "198.18.1.2", via = "s2" },"#,
    );
    assert_ne!(reordered, CONFIG);
    let mut new = lb_with(&reordered).unwrap();
    let carried = Program::inherit(&mut new, old, S);
    let to = |s: &Option<Sent>| s.unwrap().to.0;
    let left = before.iter().filter(|s| to(s) == ip("198.18.1.1")).count() as u64;
    assert!(left > 50, "{left}");
    assert_eq!(
        carried[0].to_string(),
        format!(
            "connections: kept {} entries, dropped {left} (their backend left the \
             configuration)",
            n as u64 - left
        )
    );
    assert_eq!(carried[1].to_string(), "backends: kept 4 entries");
    let down = |pools: &Pools| {
        (pools.backends.iter())
            .filter(|b| b.state != BackendState::Up)
            .map(|b| (IpAddr::from(b.address), b.port))
            .collect::<Vec<_>>()
    };
    assert_eq!(down(&new.pools), [(ip("198.18.1.3"), 8080)]);
    assert_eq!(
        down(&new.newest.lock().unwrap()),
        down(&new.pools),
        "the control plane's next change starts from it"
    );
    let after = send(
        &mut new,
        2 * S,
        &(0..n).map(|i| web(i, ACK)).collect::<Vec<_>>(),
    );
    for (b, a) in before.iter().zip(&after) {
        match to(b) {
            x if x == ip("198.18.1.2") => assert_eq!(a, b, "kept on its backend"),
            x => assert!(![x, ip("198.18.1.3")].contains(&to(a)), "{x}: picked again"),
        }
    }
}

/// The web VIP's connections `range`, each by one packet with these flags.
fn web_range(range: std::ops::Range<u32>, f: u8) -> Vec<Vec<u8>> {
    range.map(|i| web(i, f)).collect()
}

/// An entry for a new web backend, its settings those of backend 198.18.1.2 but `weight`.
fn joining(lb: &Lb, address: &str, weight: u16) -> Entry {
    let mut entry = current(lb, "198.18.1.2", 80, 6);
    entry.key = backend_fields(address, 80, 6);
    entry.params[2] = u128::from(weight);
    entry
}

#[test]
fn backends_join_with_a_weight_drain_and_leave_at_run_time_and_open_connections_stay() {
    let mut worker = lb();
    let preparer = worker.clone();
    let n = 900;
    let to = |s: &Option<Sent>| s.unwrap().to.0;
    let share = |sent: &[Option<Sent>], address: &str| {
        sent.iter().filter(|s| to(s) == ip(address)).count() as f64 / sent.len() as f64
    };
    let before = send(&mut worker, S, &web_range(0..n, SYN));
    let moved_off = |now: &[Option<Sent>]| before.iter().zip(now).filter(|(b, a)| b != a).count();

    // A backend joins with twice the others' weight: open connections stay where they
    // are; it takes about 2/5 of the new ones.
    let fourth = joining(&preparer, "198.18.1.4", 2);
    change(&mut [&mut worker], &preparer, vec![Write::Insert(fourth)]);
    let open = send(&mut worker, 2 * S, &web_range(0..n, ACK));
    assert_eq!(moved_off(&open), 0, "open connections stay where they are");
    let new = send(&mut worker, 2 * S, &web_range(n..4 * n, SYN));
    let on_fourth = share(&new, "198.18.1.4");
    assert!((0.33..0.47).contains(&on_fourth), "{on_fourth}");
    assert_eq!(
        new.iter()
            .find(|s| to(s) == ip("198.18.1.4"))
            .unwrap()
            .unwrap()
            .via,
        2
    );

    // Draining 198.18.1.1: its connections stay on it; new ones avoid it.
    let mut drain = current(&preparer, "198.18.1.1", 80, 6);
    drain.action = "drain".into();
    change(&mut [&mut worker], &preparer, vec![Write::Modify(drain)]);
    let open = send(&mut worker, 3 * S, &web_range(0..n, ACK));
    assert_eq!(
        moved_off(&open),
        0,
        "the draining backend keeps its connections"
    );
    assert!(share(&before, "198.18.1.1") > 0.2);
    let newer = send(&mut worker, 3 * S, &web_range(4 * n..5 * n, SYN));
    assert_eq!(share(&newer, "198.18.1.1"), 0.0);
    assert_eq!(worker.moved, 0);

    // Deleting the new backend: its connections move at their next packet, and its
    // answers are no longer taken as a backend's.
    let on_it = new.iter().filter(|s| to(s) == ip("198.18.1.4")).count();
    let key = backend_fields("198.18.1.4", 80, 6);
    change(&mut [&mut worker], &preparer, vec![Write::Delete(key)]);
    let again = send(&mut worker, 4 * S, &web_range(n..4 * n, ACK));
    assert!(again.iter().all(|s| to(s) != ip("198.18.1.4")));
    let others_moved = (new.iter().zip(&again))
        .filter(|(b, a)| to(b) != ip("198.18.1.4") && a != b)
        .count();
    assert_eq!(
        others_moved, 0,
        "only the deleted backend's connections move"
    );
    assert_eq!(worker.moved, on_it as u64);
    // Each worker counts the connections it moved; worker 0 also counts the backends.
    let request = Request::Stats {
        table: "backends".into(),
    };
    let mut counted = |w: usize| match worker.control(
        &request,
        None,
        &Context {
            worker: w,
            ..ctx(S, 3)
        },
    ) {
        Ok(Reply::Counters(c)) => c,
        other => panic!("{other:?}"),
    };
    assert_eq!(counted(1), [("moved", on_it as u64)]);
    let first = counted(0);
    for counter in [
        ("backends", 5),
        ("up", 4),
        ("drain", 1),
        ("moved", on_it as u64),
    ] {
        assert!(first.contains(&counter), "{counter:?} in {first:?}");
    }
    let answer = ip_frame("198.18.1.4", "198.18.2.1", tcp(80, 30_000, ACK));
    assert_eq!(verdict(&mut worker, answer, 2), Verdict::Drop(NOT_BACKEND));
    let read = worker.control(
        &Request::Read {
            table: "backends".into(),
            key: None,
            from: 0,
        },
        None,
        &ctx(S, 3),
    );
    let Ok(Reply::Page(entries, None)) = read else {
        panic!("{read:?}")
    };
    assert_eq!(entries.len(), 5, "the deleted backend is gone from reads");
    assert_eq!(
        (entries[0].action.as_str(), entries[0].params[4]),
        ("drain", 0x0200_0000_0b01),
        "state and MAC read back"
    );

    // Inserted again, it takes back its place rather than a new one.
    let places = preparer.newest.lock().unwrap().backends.len();
    let back = joining(&preparer, "198.18.1.3", 1);
    let mut back = Entry {
        key: backend_fields("198.18.1.4", 80, 6),
        ..back
    };
    back.action = "up".into();
    change(&mut [&mut worker], &preparer, vec![Write::Insert(back)]);
    assert_eq!(preparer.newest.lock().unwrap().backends.len(), places);
    let newest = send(&mut worker, 5 * S, &web_range(5 * n..6 * n, SYN));
    assert!(share(&newest, "198.18.1.4") > 0.2);
}

#[test]
fn backend_changes_that_cannot_work_are_refused_whole_and_say_why() {
    let lb = lb_with(
        &(CONFIG.replace(
            "[[vips]]\naddress = \"198.19.0.10\"",
            "max_backends = 7\n[[vips]]\naddress = \"198.19.0.10\"",
        ) + "[[vips]]\naddress = \"198.19.0.12\"\nport = 53\nproto = \"udp\"\n\
           backends = [{ address = \"198.18.1.8\" }]\n"),
    )
    .unwrap();
    let refusal = |writes: Vec<Write>| {
        let request = Request::Write {
            table: "backends".into(),
            writes,
        };
        match lb.declarations()[1].check(&request) {
            Err(e) => e.to_string(),
            Ok(()) => match lb.prepare(&request) {
                Err(e) => e.to_string(),
                Ok(_) => String::new(),
            },
        }
    };
    let fine = joining(&lb, "198.18.1.5", 1);
    let with = |f: &dyn Fn(&mut Entry)| {
        let mut e = fine.clone();
        f(&mut e);
        e
    };
    let no_vip = with(&|e| e.params[1] = 81);
    assert!(refusal(vec![Write::Insert(no_vip)]).contains("198.19.0.10:81 (proto 6) is not a VIP"),);
    let light = with(&|e| e.params[2] = 0);
    assert!(refusal(vec![Write::Insert(light)]).contains("`drain` stops new connections"));
    let heavy = with(&|e| e.params[2] = 257);
    assert!(refusal(vec![Write::Insert(heavy)]).contains("weight 257 is not from 1 to 256"));
    let looped = with(&|e| e.params[3] = 0);
    assert!(refusal(vec![Write::Insert(looped)]).contains("other than the clients' port"));
    let nowhere = with(&|e| e.params[3] = 3);
    assert!(refusal(vec![Write::Insert(nowhere)]).contains("via"));
    let mut moved = current(&lb, "198.18.1.1", 53, 17);
    moved.params[0] = u128::from(u32::from(std::net::Ipv4Addr::new(198, 19, 0, 12)));
    assert!(refusal(vec![Write::Modify(moved.clone())]).contains("serves one VIP"));
    // The web VIP is TCP: no VIP for this UDP backend.
    moved.params[0] = u128::from(u32::from(std::net::Ipv4Addr::new(198, 19, 0, 10)));
    moved.params[1] = 80;
    assert!(refusal(vec![Write::Modify(moved)]).contains("198.19.0.10:80 (proto 17) is not a VIP"));
    // All or none: a good insert before a refused one leaves the pools as they were.
    let twice = vec![Write::Insert(fine.clone()), Write::Insert(fine.clone())];
    assert_eq!(
        refusal(twice),
        ControlError::Exists {
            table: "backends".into()
        }
        .to_string()
    );
    assert!(
        lb.newest
            .lock()
            .unwrap()
            .backend_of
            .get(&endpoint([198, 18, 1, 5], 80, 6))
            .is_none()
    );
    // Seven places: the seventh backend joins; once deleted, its place stays its own.
    assert_eq!(refusal(vec![Write::Insert(fine.clone())]), "");
    let gone = Write::Delete(fine.key.clone());
    assert_eq!(refusal(vec![gone]), "");
    let seventh = joining(&lb, "198.18.1.7", 1);
    assert!(refusal(vec![Write::Insert(seventh)]).contains("all 7 backend places (max_backends)"));
    assert_eq!(refusal(vec![Write::Insert(fine)]), "", "its own place");
}

#[test]
fn with_every_backend_draining_new_connections_have_none_and_open_ones_stay() {
    let mut worker = lb();
    let preparer = worker.clone();
    let open = send(&mut worker, S, &web_range(0..30, SYN));
    let draining =
        [("198.18.1.1", 80), ("198.18.1.2", 80), ("198.18.1.3", 8080)].map(|(address, port)| {
            let mut entry = current(&preparer, address, port, 6);
            entry.action = "drain".into();
            Write::Modify(entry)
        });
    change(&mut [&mut worker], &preparer, draining.to_vec());
    assert_eq!(send(&mut worker, 2 * S, &web_range(0..30, ACK)), open);
    match verdict(&mut worker, web(30, SYN), 0) {
        Verdict::Drop(r) => assert_eq!(r.name(worker.drop_reasons()), "no_backend"),
        other => panic!("{other:?} is not a drop"),
    }
}
