//! The gRPC service and client end to end on loopback, over a real program (`acl` before
//! `router`) whose workers poll for requests: entries of every match kind go through the
//! wire and come back as they went in, and refusals arrive with their gRPC code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use stateplane_control::client::Client;
use stateplane_control::endpoint::{ClientFiles, GuardFiles, Listen};
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
    let mut client = Client::connect(&running.server.endpoint.to_string()).unwrap();
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
    let mut client = Client::connect(&running.server.endpoint.to_string()).unwrap();
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
    // Writes taken as they go: a mistake after several pieces were sent writes nothing.
    let moved = {
        let macs = macs.clone();
        // Station `i` to the other port.
        move |i: u64| {
            let mac = stateplane_wire::MacAddr::from_u64(0x0200_0000_0000 + i);
            let text = format!("vlan=0 mac={mac} forward port={}", (i + 1) % 2);
            Ok(Write::Modify(text::parse_entry(&macs, &text).unwrap()))
        }
    };
    let port_of = |client: &mut Client, i: u64| {
        let mac = stateplane_wire::MacAddr::from_u64(0x0200_0000_0000 + i);
        let key = text::parse_key(&macs, &["vlan=0", &format!("mac={mac}")]).unwrap();
        let (_, found) = client.read("macs", Some(&key)).unwrap();
        text::print_entry(&macs, &found[0])
    };
    let was = port_of(&mut client, 7);
    let failing = (0..10_000u64).map(moved.clone()).chain(std::iter::once(Err(
        "entries.txt:10001: not an entry".to_string(),
    )));
    let err = client.write_each("macs", failing).unwrap_err();
    assert!(
        err.message
            .contains("entries.txt:10001: not an entry (nothing was written)"),
        "{err}"
    );
    assert_eq!(port_of(&mut client, 7), was, "nothing was written");
    let (_, sent) = client.write_each("macs", (0..5000u64).map(moved)).unwrap();
    assert_eq!(sent, 5000);
    assert_ne!(port_of(&mut client, 7), was, "the whole batch was written");
    // An empty table is one empty piece.
    let empty = Running::start("l2", toml::from_str("capacity = 4").unwrap());
    let mut client = Client::connect(&empty.server.endpoint.to_string()).unwrap();
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
        Running::start_at(program, config, &Listen::loopback(0)).unwrap()
    }

    /// `program` served at `listen`, or why the server refused to start.
    fn start_at(program: &str, config: toml::Value, listen: &Listen) -> Result<Running, String> {
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
        match Server::start(listen, service) {
            Ok(server) => Ok(Running {
                server,
                stop,
                workers,
            }),
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                workers.into_iter().for_each(|w| w.join().unwrap());
                Err(e)
            }
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

/// A run that cannot reload (this one has no configuration to read again) refuses the
/// control API's `Reload` by name, rather than answer as if it had.
#[test]
fn a_reload_is_refused_where_the_run_cannot_reload() {
    let config: toml::Value = toml::from_str("tables = 1").unwrap();
    let running = Running::start("pipeline", config);
    let mut client = Client::connect(&running.server.endpoint.to_string()).unwrap();
    let e = client.reload().unwrap_err().to_string();
    assert!(e.contains("this run cannot reload"), "{e}");
}

/// Rule text through gRPC: added, dumped back in the same form, modified and deleted by
/// cookie; a bad line is refused with its line number and the InvalidArgument code.
#[test]
fn rule_pipeline_flows_go_through_grpc() {
    use stateplane_state::{FlowChange, FlowFilter, Kind};
    let config: toml::Value = toml::from_str("tables = 2\nmiss = [\"continue\"]").unwrap();
    let running = Running::start("pipeline", config);
    let mut client = Client::connect(&running.server.endpoint.to_string()).unwrap();
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

/// A rule file past gRPC's message limit goes in pieces and is applied whole; a dump of
/// it comes back in pieces; a bad line deep in a large add refuses the whole add, named by
/// its line number in the file; a delete of everything answers every rule.
#[test]
fn rule_changes_past_the_message_limit_go_in_pieces_and_apply_whole() {
    use prost::Message;
    use stateplane_state::{FlowChange, FlowFilter};
    let n = 50_000;
    let config: toml::Value = toml::from_str(&format!("capacity = {}", n + 10)).unwrap();
    let running = Running::start("pipeline", config);
    let mut client = Client::connect(&running.server.endpoint.to_string()).unwrap();
    let rule = |i: u32| {
        let [_, _, a, b] = i.to_be_bytes();
        format!(
            "table=0,priority=100,cookie=0x{i:x},udp,nw_src=198.18.{a}.{b},nw_dst=198.19.{a}.{b}/32,tp_dst=53,actions=mod_dl_dst:02:00:00:00:0b:01,output:1"
        )
    };
    let lines: Vec<String> = (0..n).map(rule).collect();
    let add = FlowChange::Add {
        lines: lines.clone(),
        keep_counters: false,
    };
    let one_message = stateplane_control::pb::FlowsRequest {
        name: "flows".into(),
        change: Some(stateplane_control::convert::flow_change_to_pb(&add).unwrap()),
    };
    assert!(
        one_message.encoded_len() > 4 << 20,
        "{}",
        one_message.encoded_len()
    );

    // A bad line near the end: nothing is added, and the error names its line.
    let mut bad = lines[..45_000].to_vec();
    bad.push("table=0,priority=1,nw_dst=198.19.0.0/33,actions=drop".into());
    let err = client
        .flows(
            "flows",
            &FlowChange::Add {
                lines: bad,
                keep_counters: false,
            },
        )
        .unwrap_err();
    assert_eq!(err.code, tonic::Code::InvalidArgument, "{err}");
    assert!(err.message.contains("line 45001"), "{err}");
    let dump = FlowChange::Dump(FlowFilter::default());
    assert_eq!(client.flows("flows", &dump).unwrap().flows.len(), 0);

    client.flows("flows", &add).unwrap();
    let mut pieces = Vec::new();
    client
        .flows_each("flows", &dump, |piece| {
            pieces.push(piece.len());
            Ok(())
        })
        .unwrap();
    assert_eq!(pieces.iter().sum::<usize>(), n as usize);
    assert!(
        pieces.len() > 1 && pieces.iter().all(|&p| p <= stateplane_control::PIECE),
        "{pieces:?}"
    );
    let deleted = client
        .flows("flows", &FlowChange::Delete(FlowFilter::default()))
        .unwrap();
    assert_eq!(deleted.flows.len(), n as usize);
}

/// A directory for one test's files, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "stateplane-test-grpc-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// Writes `text` into the file `name` and gives its path.
    fn file(&self, name: &str, text: &str) -> std::path::PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The default endpoint's kind: a Unix socket placed with mode 0600 in a directory made
/// 0700, reached by `unix:PATH` and by the bare path; a write over it is logged with the
/// caller's user and process; a second server cannot take it while the first listens,
/// nor a path that is not a socket; a stale socket is replaced; the socket goes with its
/// server.
#[test]
fn the_control_api_listens_on_a_unix_socket_only_its_user_can_open() {
    use std::os::unix::fs::PermissionsExt;
    logged();
    let dir = TempDir::new("unix");
    let path = dir.0.join("run/control.sock");
    let listen = Listen::Unix(path.clone());
    let running =
        Running::start_at("l2", toml::from_str("capacity = 4").unwrap(), &listen).unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&dir.0.join("run")), 0o700);
    assert_eq!(
        running.server.endpoint.to_string(),
        format!("unix:{}", path.display())
    );

    let mut client = Client::connect(&running.server.endpoint.to_string()).unwrap();
    let me = format!("by uid 0 (pid {}) on the Unix socket", std::process::id());
    write_station_logged(&mut client, 1, &[&me]);
    let by_path = Client::connect(path.to_str().unwrap()).unwrap();
    assert_eq!(by_path.program(), "l2");

    let second = Running::start_at("l2", toml::from_str("capacity = 4").unwrap(), &listen);
    let err = second.err().unwrap();
    assert!(
        err.contains("another process listens on") && err.contains("control.sock"),
        "{err}"
    );
    assert!(
        path.exists(),
        "the refused server leaves the first one's socket"
    );

    drop(client);
    drop(by_path);
    drop(running);
    assert!(!path.exists(), "the socket goes with its server");

    // A socket left behind by a process that died is nobody's: it is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let again = Running::start_at("l2", toml::from_str("capacity = 4").unwrap(), &listen).unwrap();
    assert_eq!(mode(&path), 0o600);
    drop(again);

    // A file that is not a socket is never removed.
    let file = dir.file("run/control.sock", "keep me");
    let err = Running::start_at("l2", toml::from_str("capacity = 4").unwrap(), &listen)
        .err()
        .unwrap();
    assert!(err.contains("exists and is not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(file).unwrap(), "keep me");
}

/// The test PKI (`stateplane_test_pki`: a CA, a server certificate for loopback that it
/// signed, a client certificate it signed, and a client certificate from another CA),
/// with a token and a wrong one.
struct Pki {
    pki: stateplane_test_pki::TestPki,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let pki = stateplane_test_pki::TestPki::new(&format!("grpc-{name}")).unwrap();
        pki.file("token", "0123456789abcdef-the-right-token\n")
            .unwrap();
        pki.file("wrong-token", "0123456789abcdef-not-the-token\n")
            .unwrap();
        Pki { pki }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.pki.path(name)
    }

    /// The server's files, with a token or a client CA.
    fn guard(&self, token: bool, client_ca: bool) -> GuardFiles {
        GuardFiles {
            cert: Some(self.path("server.pem")),
            key: Some(self.path("server.key")),
            client_ca: client_ca.then(|| self.path("ca.pem")),
            token_file: token.then(|| self.path("token")),
        }
    }

    /// A client's files: trusting `ca`, presenting `cert` (a name of this PKI's), sending
    /// the token in `token`.
    fn client(&self, ca: &str, cert: Option<&str>, token: Option<&str>) -> ClientFiles {
        ClientFiles {
            ca: Some(self.path(ca)),
            cert: cert.map(|c| self.path(&format!("{c}.pem"))),
            key: cert.map(|c| self.path(&format!("{c}.key"))),
            token_file: token.map(|t| self.path(t)),
        }
    }
}

/// Beyond loopback the control API takes TLS and a way to tell clients apart, or it does
/// not start; every half-given guard is refused naming what is missing.
#[test]
fn beyond_loopback_the_control_api_needs_tls_and_a_token_or_client_certificates() {
    let pki = Pki::new("refusals");
    let refused = |text: &str, files: &GuardFiles| match Listen::parse(text, files) {
        Ok(l) => panic!("{text} was accepted as {l}"),
        Err(e) => e,
    };
    let none = GuardFiles::default();
    let e = refused("0.0.0.0:9559", &none);
    assert!(
        e.contains("needs TLS")
            && e.contains("--control-cert")
            && e.contains("--control-token-file"),
        "{e}"
    );
    let e = refused(
        "198.18.0.1:9559",
        &GuardFiles {
            token_file: None,
            client_ca: None,
            ..pki.guard(false, false)
        },
    );
    assert!(
        e.contains("lets anyone in") && e.contains("--control-client-ca"),
        "{e}"
    );
    let e = refused(
        "0.0.0.0:9559",
        &GuardFiles {
            key: None,
            ..pki.guard(true, false)
        },
    );
    assert!(
        e.contains("needs both --control-cert FILE") && e.contains("--control-key FILE"),
        "{e}"
    );
    let e = refused("unix:/run/x.sock", &pki.guard(true, false));
    assert!(
        e.contains("is a Unix socket, which its file mode guards"),
        "{e}"
    );
    let e = refused(
        "0.0.0.0:9559",
        &GuardFiles {
            token_file: Some(pki.pki.file("short", "secret\n").unwrap()),
            ..pki.guard(true, false)
        },
    );
    assert!(e.contains("at least 16 printable characters"), "{e}");
    let e = refused(
        "0.0.0.0:9559",
        &GuardFiles {
            cert: Some(pki.path("token")),
            ..pki.guard(true, false)
        },
    );
    assert!(e.contains("--control-cert") && e.contains("not PEM"), "{e}");
    let e = refused("localhost:9559", &none);
    assert!(e.contains("neither HOST:PORT"), "{e}");
    // Loopback without TLS, and any address with a whole guard, are taken.
    assert!(matches!(
        Listen::parse("127.0.0.1:9559", &none),
        Ok(Listen::Tcp { guard: None, .. })
    ));
    assert!(matches!(
        Listen::parse("[::]:9559", &pki.guard(false, true)),
        Ok(Listen::Tcp { guard: Some(_), .. })
    ));
    // A server asked directly for an address beyond loopback without a guard refuses.
    let bare = Listen::Tcp {
        addr: "0.0.0.0:0".parse().unwrap(),
        guard: None,
    };
    let e = Running::start_at("l2", toml::from_str("capacity = 4").unwrap(), &bare)
        .err()
        .unwrap();
    assert!(e.contains("beyond loopback only with TLS"), "{e}");
}

/// A control API on every address behind TLS and a token: the right token is let in (and
/// named in the log of its writes); a wrong token, no token, a client without TLS, and a
/// client that does not trust the server's certificate are all refused.
#[test]
fn a_wrong_token_is_refused_and_the_right_one_is_let_in() {
    logged();
    let pki = Pki::new("token");
    let listen = Listen::parse("0.0.0.0:0", &pki.guard(true, false)).unwrap();
    let running =
        Running::start_at("l2", toml::from_str("capacity = 4").unwrap(), &listen).unwrap();
    let Listen::Tcp { addr, .. } = running.server.endpoint else {
        panic!("a TCP endpoint")
    };
    let server = format!("https://127.0.0.1:{}", addr.port());

    let mut client =
        Client::connect_with(&server, &pki.client("ca.pem", None, Some("token"))).unwrap();
    write_station_logged(&mut client, 2, &["by 127.0.0.1:", "with the token"]);

    let err = Client::connect_with(&server, &pki.client("ca.pem", None, Some("wrong-token")))
        .err()
        .unwrap();
    assert_eq!(err.code, tonic::Code::Unauthenticated, "{err}");
    assert!(
        err.message.contains("the token is not the switch's"),
        "{err}"
    );
    let err = Client::connect_with(&server, &pki.client("ca.pem", None, None))
        .err()
        .unwrap();
    assert_eq!(err.code, tonic::Code::Unauthenticated, "{err}");
    assert!(
        err.message.contains("carries no token") && err.message.contains("--token-file"),
        "{err}"
    );
    assert!(
        logged()
            .iter()
            .any(|l| l.contains("refused: the token is not the switch's")),
        "refusals are logged"
    );

    // Without TLS the server does not answer at all.
    let plain = format!("127.0.0.1:{}", addr.port());
    assert!(Client::connect(&plain).is_err());
    // A client that trusts another CA does not send its token to this server.
    let err = Client::connect_with(&server, &pki.client("other-ca.pem", None, Some("token")))
        .err()
        .unwrap();
    assert_eq!(err.code, tonic::Code::Unavailable, "{err}");
    assert!(err.message.to_lowercase().contains("certificate"), "{err}");
}

/// A control API that asks clients for a certificate its CA signed: such a client is let
/// in and named in the log; one from another CA, or with none, is refused.
#[test]
fn a_client_certificate_from_another_ca_is_refused() {
    logged();
    let pki = Pki::new("certs");
    let listen = Listen::parse("127.0.0.1:0", &pki.guard(false, true)).unwrap();
    let running =
        Running::start_at("l2", toml::from_str("capacity = 4").unwrap(), &listen).unwrap();
    let server = running.server.endpoint.to_string();
    assert!(server.starts_with("https://127.0.0.1:"), "{server}");

    let mut client =
        Client::connect_with(&server, &pki.client("ca.pem", Some("client"), None)).unwrap();
    write_station_logged(
        &mut client,
        3,
        &["by 127.0.0.1:", "with a client certificate"],
    );

    for cert in [Some("intruder"), None] {
        let refused = Client::connect_with(&server, &pki.client("ca.pem", cert, None));
        let err = refused
            .err()
            .unwrap_or_else(|| panic!("{cert:?} was let in"));
        // The server's refusal reaches the client as the handshake fails or, with TLS 1.3
        // (the client's certificate checked after the client thinks it is done), as the
        // first call is cut off: unavailable, unknown or cancelled by the timing.
        assert!(
            matches!(
                err.code,
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
            ),
            "{cert:?}: {err:?}"
        );
    }
}

/// An insert of the entry `text` into the table `d` declares.
fn insert(d: &stateplane_state::Declaration, text: &str) -> Write {
    Write::Insert(text::parse_entry(d, text).unwrap())
}

/// Writes station `n` into `macs` through `client`, and checks that the control API logged
/// the write with each of `says` (who made it).
fn write_station_logged(client: &mut Client, n: u8, says: &[&str]) {
    let d = client.declaration("macs").unwrap().clone();
    let station = format!("vlan=0 mac=02:00:00:00:00:{n:02x} forward port=1");
    client.write("macs", &[insert(&d, &station)]).unwrap();
    assert!(
        logged()
            .iter()
            .any(|l| l.starts_with("control API: 1 updates to `macs` ")
                && says.iter().all(|s| l.contains(s))),
        "{says:?}: {:?}",
        logged()
    );
}
