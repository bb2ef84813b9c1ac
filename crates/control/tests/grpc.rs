//! The gRPC service and client end to end on loopback, over a real program (`acl` before
//! `router`) whose workers poll for requests: entries of every match kind go through the
//! wire and come back as they went in, and refusals arrive with their gRPC code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use stateplane_control::client::Client;
use stateplane_control::entry_text as text;
use stateplane_control::server::{ControlService, Server};
use stateplane_runtime::{Burst, ControlPlane, Worker};
use stateplane_state::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[test]
fn entries_of_every_match_kind_go_through_grpc_and_come_back() {
    let config: toml::Value = toml::from_str(
        r#"
        capacity = 8
        rules = [ { action = "permit", dst = "198.19.0.0/16" } ]
        [router]
        routes = [ { prefix = "198.19.0.0/16", port = "b", next_hop_mac = "02:00:00:00:0b:01" } ]
        "#,
    )
    .unwrap();
    logged();
    let running = Running::start("acl", config);
    let mut client = Client::connect(&running.server.addr.to_string()).unwrap();
    assert_eq!(client.program(), "acl");
    let names: Vec<&str> = client
        .declarations()
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "rules",
            "rule_packets",
            "rule_bytes",
            "rule_meters",
            "routes4",
            "routes6"
        ]
    );

    let rule = "src=198.18.0.0/15 dst=198.19.7.0/24 proto=17&&&255 src_port=0..65535 \
                dst_port=1000..2000 deny priority=9";
    let rules = client.declaration("rules").unwrap().clone();
    let entry = text::parse_entry(&rules, rule).unwrap();
    let v1 = client
        .write("rules", &[Write::Insert(entry.clone())])
        .unwrap();
    let (v2, read) = client.read("rules", None).unwrap();
    assert!(v2 > v1);
    // The change is logged with the client that made it (its address and port).
    let said = "control API: 1 updates to `rules` by 127.0.0.1:";
    let line = logged().into_iter().find(|l| l.starts_with(said));
    assert!(
        line.as_ref()
            .is_some_and(|l| l.ends_with(&format!(", at version {v1}"))),
        "{line:?}"
    );
    let back = read
        .iter()
        .find(|e| e.priority == 9)
        .expect("the rule is read back");
    assert_eq!((&back.key, &back.action), (&entry.key, &entry.action));
    assert_eq!(text::print_entry(&rules, back), format!("{rule} hits=0"));

    let routes = client.declaration("routes6").unwrap().clone();
    let route = text::parse_entry(
        &routes,
        "dst=2001:2:5::/48 route port=1 mac=02:00:00:00:0b:06",
    )
    .unwrap();
    client
        .write("routes6", &[Write::Insert(route.clone())])
        .unwrap();
    let (_, read) = client.read("routes6", Some(&route.key)).unwrap();
    assert_eq!((read.len(), &read[0].params), (1, &route.params));

    // Refusals keep their cause across the wire.
    let again = client.write("rules", &[Write::Insert(entry)]).unwrap_err();
    assert_eq!(again.code, tonic::Code::AlreadyExists, "{again}");
    assert!(
        logged()
            .iter()
            .any(|l| l.starts_with(said) && l.contains(", refused: table `rules` already has")),
        "a refused change is logged too"
    );
    let port = text::parse_entry(
        &routes,
        "dst=2001:2:6::/48 route port=7 mac=02:00:00:00:0b:06",
    )
    .unwrap();
    let far = client.write("routes6", &[Write::Insert(port)]).unwrap_err();
    assert_eq!(far.code, tonic::Code::OutOfRange, "{far}");
    assert!(far.message.contains("there is no port 7"), "{far}");
    let missing = client.read("nope", None).unwrap_err();
    assert_eq!(missing.code, tonic::Code::NotFound);
    assert!(missing.message.contains("rules, rule_packets"), "{missing}");
    let values = client.read_register("rule_packets", 0, 0).unwrap();
    assert_eq!(
        values.len(),
        9,
        "the whole register: 8 rules and the default"
    );
    assert!(
        values.iter().all(|v| v.len() == 8),
        "64-bit values as 8 bytes"
    );

    // Meters: set over a range, read back; impossible settings refused with the cause.
    let police = stateplane_state::MeterConfig::SrTcm {
        cir: 125_000,
        cbs: 3000,
        ebs: 6000,
    };
    client.set_meter("rule_meters", 2, 3, &police).unwrap();
    let read = client.read_meter("rule_meters", 1, 5).unwrap();
    let off = stateplane_state::MeterConfig::Off;
    assert_eq!(read, [off, police, police, police, off]);
    let backwards = stateplane_state::MeterConfig::TrTcm {
        cir: 10,
        cbs: 1,
        pir: 5,
        pbs: 1,
    };
    let refused = client
        .set_meter("rule_meters", 0, 1, &backwards)
        .unwrap_err();
    assert_eq!(refused.code, tonic::Code::InvalidArgument);
    assert!(refused.message.contains("RFC 2698"), "{refused}");
}

/// A program's workers on threads, polling for requests, behind the gRPC server.
/// A batch larger than one gRPC message holds (4 MB) is written whole, in pieces applied as
/// one batch (it failed at the message limit), all or none; a table of that size reads
/// back whole, piece by piece.
#[test]
fn a_batch_past_the_message_limit_is_written_whole_and_read_back_in_pieces() {
    use prost::Message;
    let n: u64 = 200_000;
    let config: toml::Value = toml::from_str(&format!("capacity = {}", n + 10)).unwrap();
    let running = Running::start("l2", config);
    let mut client = Client::connect(&running.server.addr.to_string()).unwrap();
    let macs = client.declaration("macs").unwrap().clone();
    let station = |i: u64| {
        let mac = stateplane_wire::MacAddr::from_u64(0x0200_0000_0000 + i);
        let text = format!("vlan=0 mac={mac} forward port={}", i % 2);
        Write::Insert(text::parse_entry(&macs, &text).unwrap())
    };
    let batch: Vec<Write> = (0..n).map(station).collect();
    // What one message would have carried: past gRPC's limit.
    let one_message = stateplane_control::pb::WriteRequest {
        table: "macs".into(),
        updates: (batch.iter())
            .map(|w| {
                let Write::Insert(e) = w else { unreachable!() };
                stateplane_control::pb::Update {
                    r#type: 0,
                    entry: Some(stateplane_control::convert::entry_to_pb(e, &macs)),
                }
            })
            .collect(),
    };
    assert!(
        one_message.encoded_len() > 4 << 20,
        "{}",
        one_message.encoded_len()
    );
    client.write("macs", &batch).unwrap();
    let pieces = piece_sizes(&mut client, "macs");
    assert_eq!(pieces.iter().sum::<usize>() as u64, n);
    assert!(
        pieces.iter().all(|&p| p <= stateplane_control::PIECE),
        "{pieces:?}"
    );
    let (_, all) = client.read("macs", None).unwrap();
    assert_eq!(all.len() as u64, n);

    // A large batch whose last update cannot be applied changes nothing.
    let mut refused: Vec<Write> = (n..n + 9).map(station).collect();
    refused.splice(0..0, (0..5000).map(|i| station(n + 100 + i)));
    refused.push(station(0));
    let err = client.write("macs", &refused).unwrap_err();
    assert_eq!(err.code, tonic::Code::ResourceExhausted, "{err}");
    assert_eq!(client.read("macs", None).unwrap().1.len() as u64, n);
    // An empty table is one empty piece.
    let empty = Running::start("l2", toml::from_str("capacity = 4").unwrap());
    let mut client = Client::connect(&empty.server.addr.to_string()).unwrap();
    let pieces = piece_sizes(&mut client, "macs");
    assert_eq!(pieces, [0]);
}

/// What this test process has logged (the first call starts keeping it).
fn logged() -> Vec<String> {
    static LINES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    struct Keep;
    impl log::Log for Keep {
        fn enabled(&self, m: &log::Metadata) -> bool {
            m.level() <= log::Level::Info
        }
        fn log(&self, record: &log::Record) {
            LINES.lock().unwrap().push(record.args().to_string());
        }
        fn flush(&self) {}
    }
    static START: std::sync::Once = std::sync::Once::new();
    START.call_once(|| {
        log::set_logger(&Keep).unwrap();
        log::set_max_level(log::LevelFilter::Info);
    });
    LINES.lock().unwrap().clone()
}

/// The sizes of the pieces a read of `table` comes in.
fn piece_sizes(client: &mut Client, table: &str) -> Vec<usize> {
    let mut pieces = Vec::new();
    client
        .read_each(table, None, |piece| {
            pieces.push(piece.len());
            Ok(())
        })
        .unwrap();
    pieces
}

struct Running {
    server: Server,
    stop: Arc<AtomicBool>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    fn start(program: &str, config: toml::Value) -> Running {
        let names = stateplane_programs::PortNames(vec!["a".into(), "b".into()]);
        let factory = stateplane_programs::build(program, Some(&config), &names).unwrap();
        let (plane, ends) = ControlPlane::new(2, factory(0));
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = ends
            .into_iter()
            .enumerate()
            .map(|(w, end)| {
                let (program, stop) = (factory(w), stop.clone());
                std::thread::spawn(move || {
                    let hasher = stateplane_wire::FlowHasher::with_seed(1);
                    let mut worker = Worker::new(program, w, 2, 2, hasher).with_control(end);
                    let mut idle = Burst::with_capacity(1);
                    while !stop.load(Ordering::Relaxed) {
                        worker.poll(&mut idle);
                        std::thread::sleep(std::time::Duration::from_micros(100));
                    }
                })
            })
            .collect();
        let service = ControlService::new(plane, program, Arc::new(Vec::new));
        let server = Server::start("127.0.0.1:0".parse().unwrap(), service).unwrap();
        Running {
            server,
            stop,
            workers,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Rule text through gRPC: added, dumped back in the same form, modified and deleted by
/// cookie; a bad line is refused with its line number and the InvalidArgument code.
#[test]
fn rule_pipeline_flows_go_through_grpc() {
    use stateplane_state::{FlowChange, FlowFilter, Kind};
    let config: toml::Value = toml::from_str("tables = 2\nmiss = [\"continue\"]").unwrap();
    let running = Running::start("pipeline", config);
    let mut client = Client::connect(&running.server.addr.to_string()).unwrap();
    let d = client.declaration("flows").unwrap();
    assert_eq!(d.kind, Kind::Rules { tables: 2 });
    let rule = "table=1,priority=24,cookie=0x7,udp,nw_dst=198.19.7.0/24,tp_dst=1000-2000,actions=mod_dl_dst:02:00:00:00:0b:01,output:1";
    let add = FlowChange::Add {
        lines: vec![
            rule.into(),
            "table=0,priority=1,actions=goto_table:1".into(),
        ],
        keep_counters: false,
    };
    let v1 = client.flows("flows", &add).unwrap().version;
    let dump = client
        .flows("flows", &FlowChange::Dump(FlowFilter::default()))
        .unwrap();
    let (v2, dumped) = (dump.version, dump.flows);
    assert!(v2 > v1);
    assert_eq!(dumped.len(), 2);
    assert_eq!(dumped[1].rule, rule, "read back as written");
    assert_eq!((dumped[1].table, dumped[1].cookie), (1, 7));

    let cookie = FlowFilter {
        table: None,
        cookie: 7,
        cookie_mask: u64::MAX,
    };
    let modify = FlowChange::Modify {
        filter: cookie,
        actions: "output:0".into(),
    };
    let modified = client.flows("flows", &modify).unwrap().flows;
    assert!(
        modified[0].rule.ends_with("actions=output:0"),
        "{}",
        modified[0].rule
    );
    let bad = FlowChange::Add {
        lines: vec!["".into(), "tcp,tp_dst=eighty,actions=drop".into()],
        keep_counters: false,
    };
    let refused = client.flows("flows", &bad).unwrap_err();
    assert_eq!(refused.code, tonic::Code::InvalidArgument);
    assert!(refused.message.contains("line 2"), "{refused}");
    let deleted = client
        .flows("flows", &FlowChange::Delete(cookie))
        .unwrap()
        .flows;
    assert_eq!(deleted.len(), 1);
    let left = client
        .flows("flows", &FlowChange::Dump(FlowFilter::default()))
        .unwrap()
        .flows;
    assert_eq!(left.len(), 1);
    // A replace over the API: what it deleted, added and kept.
    let replace = FlowChange::Replace {
        table: None,
        lines: vec![
            "table=0,priority=1,actions=goto_table:1".into(),
            "table=1,priority=2,actions=drop".into(),
        ],
    };
    let replaced = client.flows("flows", &replace).unwrap();
    assert_eq!(
        (replaced.flows.len(), replaced.added, replaced.kept),
        (0, 1, 1)
    );
    // An expiry is the data plane's to ask for: no client sends one.
    let expire = FlowChange::Expire(Vec::new());
    let refused = client.flows("flows", &expire).unwrap_err();
    assert!(
        refused.message.contains("expire by their timeouts"),
        "{refused}"
    );
}
