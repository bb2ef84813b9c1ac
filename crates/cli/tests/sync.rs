//! The `synced` guarantee end to end through the binary: `stateplane run` with a program's
//! sketch synced to a `stateplane collector` over UDP on loopback, signed with a key, while
//! malformed and spoofed datagrams arrive at the collector; the messages read from a
//! capture by a decoder written from docs/SYNC.md alone; and the configurations that must
//! be refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{bin, free_port, ok, refused, tmp};
use stateplane_lab::RedisServer;
use stateplane_sync::wire::{Key, Kind, Message};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::path::Path;
use std::process::{Child, Command, Stdio};

const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// A collector on a free loopback port, and that port; its standard error is read on
/// (for the failure's message).
fn start_collector(args: &[&str]) -> (Child, String, std::thread::JoinHandle<String>) {
    let mut child = bin()
        .args(["collector", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    // Log lines may come first.
    let mut line = String::new();
    for _ in 0..20 {
        line.clear();
        stderr.read_line(&mut line).unwrap();
        if line.starts_with("collector listening on ") {
            break;
        }
    }
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
        rest
    });
    let addr = line
        .trim()
        .strip_prefix("collector listening on ")
        .unwrap_or_else(|| panic!("the collector said: {line}"))
        .to_string();
    (child, addr, rest)
}

/// A collector of one switch whose messages carry MACs of [`KEY`] (written to
/// `key_file`), dumping its copy to `dump` as it stops; `more` arguments before those.
fn start_keyed_collector(
    key_file: &Path,
    dump: &Path,
    more: &[&str],
) -> (Child, String, std::thread::JoinHandle<String>) {
    std::fs::write(key_file, format!("{KEY}\n")).unwrap();
    let (key, dump) = (key_file.display().to_string(), dump.display().to_string());
    let ours = ["--key-file", &key, "--switches", "1", "--dump", &dump];
    start_collector(&[more, &ours[..]].concat())
}

/// Stops the collector as a user would (SIGTERM) and returns its summary.
fn stop_collector(child: Child, stderr: std::thread::JoinHandle<String>) -> String {
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let out = child.wait_with_output().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(out.status.success(), "the collector failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn hh_config(dir: &Path, collector: &str, extra_sync: &str) -> std::path::PathBuf {
    let config = dir.join("sync-run.toml");
    std::fs::write(
        &config,
        format!(
            r#"
workers = 2
[program]
name = "hh"
[program.hh]
tenants = 1
width = 1024
depth = 2
interval_ms = 3600000
map = {{ in = "out" }}
[guarantees]
sketch = ["synced"]
[sync]
collector = "{collector}"
{extra_sync}
[[port]]
name = "in"
rx = "sync-in.pcap"
[[port]]
name = "out"
"#
        ),
    )
    .unwrap();
    config
}

/// A folder of the test's own holding `sync-in.pcap`, the trace `hh_config` reads (each
/// test its own, as tests run side by side).
fn trace_in(name: &str) -> std::path::PathBuf {
    let dir = tmp(name);
    std::fs::create_dir_all(&dir).unwrap();
    ok(bin()
        .args(["gen", "internet", "--packets", "30000", "--seed", "7", "-o"])
        .arg(dir.join("sync-in.pcap"))
        .output()
        .unwrap());
    dir
}

/// Runs `config` (written to `file`) to a started collector and stops the collector once
/// what the run sent has had time to arrive: the run's summary, every message sent and
/// none missing at the collector.
fn run_to_collector(
    file: &Path,
    config: &str,
    (collector, collector_err): (Child, std::thread::JoinHandle<String>),
) -> serde_json::Value {
    std::fs::write(file, config).unwrap();
    let summary = run_json(file);
    assert_eq!(summary["sync"]["send_errors"], 0, "{summary}");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let table = stop_collector(collector, collector_err);
    assert!(table.contains("gaps 0"), "{table}");
    summary
}

/// Runs the switch of `config` to its end; its summary.
fn run_json(config: &Path) -> serde_json::Value {
    let out = ok(bin()
        .args(["run", "--json", "--config"])
        .arg(config)
        .output()
        .unwrap());
    serde_json::from_str(&out).unwrap()
}

fn signed(key: Option<&Key>, m: &Message) -> Vec<u8> {
    let mut bytes = Vec::new();
    m.encode_with(key, &mut bytes);
    bytes
}

/// Every counter a run's sketches hold reaches the collector exactly (bound 0) once the
/// run ends; each row of a worker's sketch sums to the packets it counted, so the rows
/// of all workers sum to the packets forwarded. Datagrams that are malformed, unsigned,
/// signed with another key or from an unknown switch are refused, each by its reason,
/// and change nothing.
#[test]
fn a_synced_sketch_reaches_the_collector_exactly_and_bad_datagrams_are_refused() {
    let dir = trace_in("sync-exact");
    let key_file = tmp("sync.key");
    let dump = tmp("sync-dump.csv");
    let key_arg = key_file.display().to_string();
    let metrics = format!("127.0.0.1:{}", free_port());
    let (collector, addr, collector_err) =
        start_keyed_collector(&key_file, &dump, &["--metrics", &metrics]);

    // Bad datagrams first: none of them may open a stream or touch one.
    let key = Key::from_hex(KEY).unwrap();
    let other = Key::new([7; 32]);
    let forged = Message {
        kind: Kind::Updates,
        switch: 1,
        epoch: u32::MAX,
        stream: 0,
        seq: 1,
        sent_ns: 0,
        t_max: 0,
        more: false,
        entries: vec![stateplane_sync::Update {
            location: stateplane_sync::Location { state: 0, index: 0 },
            value: 1 << 40,
            threshold: 0,
        }],
    };
    let spoofer = UdpSocket::bind("127.0.0.1:0").unwrap();
    let unknown = Message {
        switch: 9,
        ..forged.clone()
    };
    for bytes in [
        signed(Some(&key), &forged)[..30].to_vec(),
        signed(None, &forged),
        signed(Some(&other), &forged),
        signed(Some(&key), &unknown),
    ] {
        spoofer.send_to(&bytes, &addr).unwrap();
    }

    // The rate controller's threshold first; then the switch starts again with a fixed
    // one that holds most changes back until the timeout monitor or the end's refresh.
    let mut forwarded = 0;
    for threshold in ["\"adaptive\"", "64"] {
        let sync = format!("key_file = \"{key_arg}\"\nthreshold = {threshold}");
        let summary = run_json(&hh_config(&dir, &addr, &sync));
        let out = summary.to_string();
        forwarded = summary["counters"]["tx_packets"].as_u64().unwrap();
        assert_eq!(forwarded, 30_000, "{out}");
        let sync = &summary["sync"];
        assert!(sync["messages"].as_u64().unwrap() > 0, "{out}");
        assert_eq!(sync["send_errors"], 0, "{out}");
        // Each packet adds 1 to one counter of each of the 2 rows; a pass takes a counter
        // changed many times since the one before once.
        let changes = sync["changes"].as_u64().unwrap();
        assert!((1..=2 * forwarded).contains(&changes), "{out}");
    }

    // The end-of-run refresh is on its way: give it a moment, then scrape, then stop.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let scrape = common::get_metrics(&metrics).expect("the collector serves its metrics");
    for line in [
        "stateplane_collector_refused_total{reason=\"bad_mac\"} 1",
        "stateplane_collector_gaps_total 0",
        "stateplane_collector_stream_locations{switch=\"1\",stream=\"1\"} 4096",
    ] {
        assert!(scrape.lines().any(|l| l == line), "{line}: {scrape}");
    }
    assert!(
        scrape.contains("stateplane_collector_stream_age_seconds{"),
        "{scrape}"
    );
    let table = stop_collector(collector, collector_err);
    for reason in ["truncated", "missing_mac", "bad_mac", "unknown_switch"] {
        assert!(table.contains(&format!("{reason} 1")), "{reason}: {table}");
    }
    assert!(table.contains("gaps 0"), "{table}");
    assert!(
        table.contains("restarts 2"),
        "the second run's two streams: {table}"
    );

    // Sketch 0 (the one tenant) and sketch 1 (shared by the others), 2 rows of 1,024 each.
    let text = std::fs::read_to_string(&dump).unwrap();
    let mut rows: BTreeMap<(u16, u32), u64> = BTreeMap::new();
    let mut streams = std::collections::BTreeSet::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f[0], "1", "only switch 1: {line}");
        assert_eq!(f[5], "0", "every location exact: {line}");
        let stream: u16 = f[1].parse().unwrap();
        let index: u32 = f[3].parse().unwrap();
        streams.insert(stream);
        *rows.entry((stream, index / 1024)).or_default() += f[4].parse::<u64>().unwrap();
    }
    assert_eq!(streams.len(), 2, "a stream per worker");
    for stream in [0, 1] {
        assert_eq!(
            rows.get(&(stream, 0)),
            rows.get(&(stream, 1)),
            "the rows of one sketch count the same packets"
        );
    }
    let counted: u64 = [0, 1].iter().map(|&s| rows[&(s, 0)]).sum();
    assert_eq!(counted, forwarded);
    assert!(
        !text.contains(&(1u64 << 40).to_string()),
        "a forged value was taken"
    );
}

/// A synced table end to end: `counter`'s flows, every word of every slot, reach the
/// collector; once the run's end is refreshed the copy holds each flow exactly, keys and
/// counts, and the packets of all its entries are the packets forwarded.
#[test]
fn a_synced_flow_table_reaches_the_collector_entry_by_entry() {
    let dir = trace_in("sync-table");
    let dump = tmp("sync-table-dump.csv");
    let dump_arg = dump.display().to_string();
    let api = format!("127.0.0.1:{}", free_port());
    let (collector, addr, collector_err) =
        start_collector(&["--switches", "1", "--dump", &dump_arg, "--api", &api]);
    let config = dir.join("sync-counter.toml");
    std::fs::write(
        &config,
        format!(
            r#"
workers = 2
[program]
name = "counter"
[program.counter]
capacity = 16384
idle = 86400
map = {{ in = "out" }}
[guarantees]
flows = ["synced"]
[sync]
collector = "{addr}"
[[port]]
name = "in"
rx = "sync-in.pcap"
[[port]]
name = "out"
"#
        ),
    )
    .unwrap();
    let summary = run_json(&config);
    let out = summary.to_string();
    let forwarded = summary["counters"]["tx_packets"].as_u64().unwrap();
    assert_eq!(forwarded, 30_000, "{out}");
    assert_eq!(summary["sync"]["send_errors"], 0, "{out}");
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Each stream announced the table's layout: 11 words an entry. A read that would sum
    // the workers' tables is refused, one worker's is not, and a migration given another
    // width is refused with the announced one.
    let ctl = |args: &[&str]| {
        bin()
            .args(["ctl", "-s", &api, "sync"])
            .args(args)
            .output()
            .unwrap()
    };
    let streams = ok(ctl(&["streams"]));
    assert_eq!(
        streams.lines().filter(|l| l.contains("x11")).count(),
        2,
        "{streams}"
    );
    let summed = ctl(&["read", "0..11"]);
    let err = String::from_utf8_lossy(&summed.stderr);
    assert!(!summed.status.success());
    assert!(
        err.contains("state 0 of switch 1 is a table (entries of 11 words)")
            && err.contains("read one (--stream N)"),
        "{err}"
    );
    ok(ctl(&["read", "--stream", "1", "0..11"]));
    let moved = ctl(&["migrate", "--to-switch", "1", "--entry-words", "5"]);
    let err = String::from_utf8_lossy(&moved.stderr);
    assert!(
        err.contains("--entry-words 5: the source announced entries of 11 words"),
        "{err}"
    );
    let table = stop_collector(collector, collector_err);
    assert!(table.contains("gaps 0"), "{table}");

    // A slot: action (1: `count`), src (2 words), dst (2), proto, ports, vlan, packets,
    // bytes.
    let entries = dumped_entries(&dump, 11);
    assert!(entries.len() > 100, "{} flows", entries.len());
    for w in &entries {
        assert_eq!(w[0], 1, "the one action, `count`: {w:?}");
        assert!(
            w[9] >= 1 && w[10] >= 60 * w[9],
            "packets and their bytes: {w:?}"
        );
        assert!([1, 6, 17, 58].contains(&w[5]), "a protocol: {w:?}");
    }
    let keys: std::collections::BTreeSet<_> = entries.iter().map(|w| &w[1..9]).collect();
    assert_eq!(keys.len(), entries.len(), "each flow in one slot");
    let packets: u64 = entries.iter().map(|w| w[9]).sum();
    assert_eq!(
        packets, forwarded,
        "every packet counted on a flow the copy holds"
    );
}

/// docs/SYNC.md's *Messages* as an outside reader takes them: `scripts/sync-decode.py`, a
/// decoder written from that section alone (sharing no code with the switch or the
/// collector), reads every datagram of a signed run of `counter`'s synced flows captured on
/// loopback by tcpdump: each header, each entry and run as the section lays them out, each
/// MAC through b3sum's keyed BLAKE3, each stream numbered one more a message; and the copy
/// the updates and refreshes build is the collector's, location for location. Given
/// another key it finds every MAC wrong, and given none it finds every MAC unasked for:
/// what it checks can fail.
#[test]
fn the_documented_message_format_reads_a_captured_run() {
    let dir = trace_in("sync-doc");
    let key_file = dir.join("sync.key");
    let other_key = dir.join("other.key");
    std::fs::write(&other_key, format!("{}\n", "7".repeat(64))).unwrap();
    let dump = dir.join("dump.csv");
    let capture = dir.join("sync.pcap");
    let key_arg = key_file.display().to_string();
    let (collector, addr, collector_err) = start_keyed_collector(&key_file, &dump, &[]);
    let port = addr.rsplit(':').next().unwrap();
    let mut tcpdump = common::tool("tcpdump")
        // Each datagram handed over as it comes (without --immediate-mode, a block still
        // filling when tcpdump stops is lost), into a buffer the end's refresh (both
        // workers' whole tables at once) fits in: a datagram missing from the capture
        // would be missing from the copy read here.
        .args([
            "-i",
            "lo",
            "-nn",
            "--immediate-mode",
            "-U",
            "-B",
            "262144",
            "-w",
        ])
        .arg(&capture)
        .arg(format!("udp port {port}"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(tcpdump.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("listening on") {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("tcpdump did not start (it needs root): {said}");
        }
        said += &line;
    }
    let config = format!(
        "workers = 2\n[program]\nname = \"counter\"\n[program.counter]\ncapacity = 4096\n\
         map = {{ in = \"out\" }}\n[guarantees]\nflows = [\"synced\"]\n[sync]\n\
         collector = \"{addr}\"\nkey_file = \"{key_arg}\"\n\
         [[port]]\nname = \"in\"\nrx = \"sync-in.pcap\"\n[[port]]\nname = \"out\"\n"
    );
    run_to_collector(
        &dir.join("sync-counter.toml"),
        &config,
        (collector, collector_err),
    );
    let stopped = Command::new("kill")
        .args(["-INT", &tcpdump.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    tcpdump.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let count = |what: &str| -> u64 {
        let line = rest.lines().find(|l| l.ends_with(what)).unwrap_or_default();
        line.split_whitespace()
            .next()
            .unwrap_or_default()
            .parse()
            .unwrap_or(u64::MAX)
    };
    // (Its count "received by filter" takes each datagram on loopback twice, going and
    // coming, so it is no measure of what it missed: the copy below is.)
    assert_eq!(count("packets dropped by kernel"), 0, "tcpdump: {rest}");

    let decode = |key: &Path| {
        common::tool("b3sum");
        common::tool("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../scripts/sync-decode.py"
            ))
            .arg(&capture)
            .arg(key)
            .arg(&dump)
            .output()
            .unwrap()
    };
    let read = decode(&key_file);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&read.stdout),
        String::from_utf8_lossy(&read.stderr)
    );
    assert!(read.status.success(), "{said}");
    for kind in ["'updates'", "'refresh'", "'layout'", "'report'"] {
        assert!(said.contains(kind), "{kind}: {said}");
    }
    assert!(said.contains("problems: 0"), "{said}");
    assert!(said.contains("differing: 0"), "{said}");
    let macs: u64 = said
        .lines()
        .find_map(|l| l.strip_prefix("MACs checked: "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(macs > 10, "{said}");
    for (key, problem) in [
        (other_key.as_path(), "a MAC the key did not make"),
        (Path::new("-"), "a MAC where no key is set"),
    ] {
        let read = decode(key);
        let said = String::from_utf8_lossy(&read.stdout);
        assert!(!read.status.success(), "{said}");
        assert!(said.contains(&format!("{macs} x {problem}")), "{said}");
    }
}

/// The occupied slots (action word not 0) of every stream's synced table in a collector's
/// dump, `stride` words each, every word exact (its bound 0).
fn dumped_entries(dump: &Path, stride: u32) -> Vec<Vec<u64>> {
    let text = std::fs::read_to_string(dump).unwrap();
    let mut slots: BTreeMap<(u16, u32), Vec<u64>> = BTreeMap::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(
            f[5], "0",
            "every word exact after the end's refresh: {line}"
        );
        let stream: u16 = f[1].parse().unwrap();
        let index: u32 = f[3].parse().unwrap();
        let words = slots
            .entry((stream, index / stride))
            .or_insert_with(|| vec![0; stride as usize]);
        words[(index % stride) as usize] = f[4].parse().unwrap();
    }
    slots.into_values().filter(|w| w[0] != 0).collect()
}

/// Runs `program` (its settings `settings`) on `trace` with its table `state` synced to a
/// collector of its own; the summary and the collector's copy, `stride` words an entry.
fn synced_table_run(
    dir: &Path,
    program: &str,
    settings: &str,
    state: &str,
    trace: &str,
    stride: u32,
) -> (serde_json::Value, Vec<Vec<u64>>) {
    let (summary, dump) = synced_run(dir, program, settings, &[state], trace, 1);
    (summary, dumped_entries(&dump, stride))
}

/// Runs `program` (its settings `settings`) on `workers` on `trace` with `states` synced to
/// a collector of its own; the summary and the file the collector dumped its copy to.
fn synced_run(
    dir: &Path,
    program: &str,
    settings: &str,
    states: &[&str],
    trace: &str,
    workers: usize,
) -> (serde_json::Value, std::path::PathBuf) {
    let dump = dir.join(format!("{program}-dump.csv"));
    let dump_arg = dump.display().to_string();
    let (collector, addr, collector_err) =
        start_collector(&["--switches", "1", "--dump", &dump_arg]);
    let guarantees: String = states
        .iter()
        .map(|s| format!("{s} = [\"synced\"]\n"))
        .collect();
    let config = format!(
        "workers = {workers}\n[program]\nname = \"{program}\"\n[program.{program}]\n{settings}\n\
         [guarantees]\n{guarantees}[sync]\ncollector = \"{addr}\"\n\
         [[port]]\nname = \"in\"\nrx = \"{trace}\"\n[[port]]\nname = \"out\"\n"
    );
    let config_file = dir.join(format!("sync-{program}.toml"));
    let summary = run_to_collector(&config_file, &config, (collector, collector_err));
    (summary, dump)
}

/// The collector's dumped copy of each state of each stream, `(stream, state)` to its
/// values by index, every one exact.
fn dumped_states(dump: &Path) -> BTreeMap<(u16, u16), BTreeMap<u32, u64>> {
    let text = std::fs::read_to_string(dump).unwrap();
    let mut states: BTreeMap<(u16, u16), BTreeMap<u32, u64>> = BTreeMap::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(
            f[5], "0",
            "every value exact after the end's refresh: {line}"
        );
        let (stream, state) = (f[1].parse().unwrap(), f[2].parse().unwrap());
        let values = states.entry((stream, state)).or_default();
        values.insert(f[3].parse().unwrap(), f[4].parse().unwrap());
    }
    states
}

/// Rule counters synced end to end, each lane a state: acl's, which count every IPv4
/// packet, sum over the workers to the packets and bytes the run read; the firewall's,
/// which count each connection's first packet, beside its synced connections, to one
/// attempt a connection, each state in each worker's stream whole.
#[test]
fn rule_counters_reach_the_collector_exactly_beside_the_connections() {
    let dir = tmp("sync-rule-counters");
    std::fs::create_dir_all(&dir).unwrap();
    ok(bin()
        .args(["gen", "internet", "--packets", "20000", "--seed", "3"])
        .args(["--ipv6-share", "0", "-o"])
        .arg(dir.join("internet.pcap"))
        .output()
        .unwrap());
    ok(bin()
        .args(["gen", "datacenter", "--packets", "20000", "--seed", "3"])
        .args(["--flows", "10", "-o"])
        .arg(dir.join("datacenter.pcap"))
        .output()
        .unwrap());
    let counters = ["rule_packets", "rule_bytes"];
    let default = "default = \"permit\"\nmap = { in = \"out\" }";
    let (summary, dump) = synced_run(&dir, "acl", default, &counters, "internet.pcap", 2);
    assert_eq!(summary["counters"]["tx_packets"], 20_000, "{summary}");
    // Ids in the order of the names, as the summary says.
    let ids = &summary["sync"]["states"];
    let expected = serde_json::json!({"rule_bytes": 0, "rule_packets": 1});
    assert_eq!(ids, &expected, "{summary}");
    let states = dumped_states(&dump);
    let cells = 4097; // 4,096 rules and the default
    assert_eq!(
        states.len(),
        4,
        "two states of each worker's stream: {:?}",
        states.keys()
    );
    assert!(states.values().all(|v| v.len() == cells));
    let sum = |state| -> u64 {
        (states.iter())
            .filter(|((_, s), _)| *s == state)
            .flat_map(|(_, v)| v.values())
            .sum()
    };
    assert_eq!(sum(1), 20_000, "every packet counted");
    assert_eq!(
        json_u64(&summary["counters"]["rx_bytes"]),
        sum(0),
        "and its bytes"
    );
    // The run's end sends every location once more, apart from what went as it ran, and
    // the summary says against which channel.
    let sync = &summary["sync"];
    assert!(
        json_u64(&sync["sent_at_end"]) >= 2 * 2 * cells as u64,
        "{sync}"
    );
    assert!(
        json_u64(&sync["bytes_at_end"]) <= json_u64(&sync["bytes"]),
        "{sync}"
    );
    assert_eq!(sync["channel_mbps"], 100.0, "{sync}");

    let states = ["connections", "rule_packets", "rule_bytes"];
    let (summary, dump) = synced_run(
        &dir,
        "firewall",
        "inside = \"in\"",
        &states,
        "datacenter.pcap",
        2,
    );
    assert_eq!(summary["counters"]["tx_packets"], 20_000, "{summary}");
    let ids = &summary["sync"]["states"];
    let expected = serde_json::json!({"connections": 0, "rule_bytes": 1, "rule_packets": 2});
    assert_eq!(ids, &expected, "{summary}");
    let states = dumped_states(&dump);
    assert_eq!(
        states.len(),
        6,
        "three states of each worker's stream: {:?}",
        states.keys()
    );
    let (mut held, mut held_v4) = (0, 0);
    for stream in [0, 1] {
        // connections 0 (13 words a slot: its action word not 0 when held, then the
        // source's two words, the first 0 for an IPv4 address), rule_bytes 1,
        // rule_packets 2.
        let words = &states[&(stream, 0)];
        let word = |i: u32| words.get(&i).copied().unwrap_or(0);
        let slots: Vec<u32> = (words.keys())
            .filter(|&&i| i % 13 == 0 && word(i) != 0)
            .copied()
            .collect();
        let v4 = slots.iter().filter(|&&i| word(i + 1) == 0).count() as u64;
        // The policy judges IPv4 packets alone (acl's rules are IPv4 rules).
        let attempts: u64 = states[&(stream, 2)].values().sum();
        let bytes: u64 = states[&(stream, 1)].values().sum();
        assert_eq!(
            attempts, v4,
            "stream {stream}: an IPv4 connection's attempt"
        );
        assert!(bytes >= 60 * attempts, "stream {stream}: {bytes} bytes");
        held += slots.len();
        held_v4 += v4;
    }
    assert_eq!(held, 10, "the trace's flows");
    assert!((1..10).contains(&held_v4), "{held_v4} of them IPv4");
}

/// hh's sketch replicated in bounded mode and the heavy hitters found in it synced, in one
/// run: the snapshots go to the store, the reports to the collector, each state under its
/// own id (the snapshots' first), and the sketch, which the snapshots read, never to the
/// collector.
#[test]
fn a_sketch_replicated_in_snapshots_beside_synced_heavy_hitters() {
    let dir = trace_in("sync-bounded");
    let dump = dir.join("dump.csv");
    let dump_arg = dump.display().to_string();
    let (collector, addr, collector_err) =
        start_collector(&["--switches", "1", "--dump", &dump_arg]);
    let config = format!(
        "workers = 2\n[program]\nname = \"hh\"\n[program.hh]\nthreshold = 5\ntenants = 1\n\
         interval_ms = 3600000\nmap = {{ in = \"out\" }}\n\
         [guarantees]\nsketch = [\"replicated\"]\nheavy_hitters = [\"synced\"]\n\
         [replication]\nmode = \"bounded\"\nsnapshot_ms = 5\n[sync]\ncollector = \"{addr}\"\n\
         [[port]]\nname = \"in\"\nrx = \"sync-in.pcap\"\n[[port]]\nname = \"out\"\n"
    );
    let file = dir.join("sync-bounded.toml");
    let summary = run_to_collector(&file, &config, (collector, collector_err));
    let out = summary.to_string();
    assert_eq!(summary["counters"]["tx_packets"], 30_000, "{out}");
    assert_eq!(
        summary["sync"]["states"],
        serde_json::json!({"heavy_hitters": 1}),
        "{out}"
    );
    let r = &summary["replication"];
    assert_eq!(r["mode"], "bounded", "{out}");
    assert!(json_u64(&r["snapshots"]) >= 2, "{out}");
    let states = dumped_states(&dump);
    assert!(
        states.keys().all(|&(_, state)| state == 1),
        "the heavy hitters alone: {:?}",
        states.keys()
    );
    // A report's slot: action (1: `found`), the flow's key, interval, estimate.
    let stride = 1 + 8 + 2;
    let mut reports = 0;
    for words in states.values() {
        let word = |i: u32| words.get(&i).copied().unwrap_or(0);
        for slot in (words.keys()).filter(|&&i| i % stride == 0 && word(i) != 0) {
            assert_eq!(word(*slot), 1, "the one action, `found`");
            assert!(
                word(slot + stride - 1) >= 5,
                "an estimate at the threshold or more"
            );
            reports += 1;
        }
    }
    assert!(reports > 50, "{reports} heavy hitters");
}

fn json_u64(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("a count: {v}"))
}

/// firewall's connections and kv's cache synced end to end: the copy holds each
/// connection once, with every packet passed counted on one of them, and each cached key
/// once, with the value the trace PUT (every PUT of the `kv` workload carries sixteen
/// bytes of 0x5a).
#[test]
fn firewall_connections_and_a_kv_cache_reach_the_collector_exactly() {
    let dir = tmp("sync-programs");
    std::fs::create_dir_all(&dir).unwrap();
    for (workload, flows) in [("datacenter", "10"), ("kv", "200")] {
        ok(bin()
            .args(["gen", workload, "--packets", "20000", "--seed", "3"])
            .args(["--flows", flows, "-o"])
            .arg(dir.join(format!("{workload}.pcap")))
            .output()
            .unwrap());
    }

    // A slot: action (the connection's state), key (8 words), packets, answered,
    // originator, FINs.
    let (summary, connections) = synced_table_run(
        &dir,
        "firewall",
        "inside = \"in\"",
        "connections",
        "datacenter.pcap",
        13,
    );
    let passed = summary["counters"]["tx_packets"].as_u64().unwrap();
    assert_eq!(passed, 20_000, "{summary}");
    assert_eq!(connections.len(), 10, "{connections:?}");
    let keys: std::collections::BTreeSet<_> = connections.iter().map(|w| &w[1..9]).collect();
    assert_eq!(keys.len(), connections.len(), "each connection in one slot");
    assert_eq!(connections.iter().map(|w| w[9]).sum::<u64>(), passed);

    // A slot: action (1: `value`), key, len, value (two words).
    let (summary, cached) = synced_table_run(
        &dir,
        "kv",
        "server = \"198.19.0.100\"\nclients = \"in\"\nbackend = \"out\"",
        "cache",
        "kv.pcap",
        5,
    );
    assert_eq!(summary["counters"]["rx_packets"], 20_000, "{summary}");
    assert!(cached.len() > 50, "{} keys", cached.len());
    let keys: std::collections::BTreeSet<_> = cached.iter().map(|w| w[1]).collect();
    assert_eq!(keys.len(), cached.len(), "each key in one slot");
    let put = u64::from_be_bytes([0x5a; 8]);
    for w in &cached {
        assert_eq!(w[0], 1, "the one action, `value`: {w:?}");
        assert_eq!(w[2..], [16, put, put], "{w:?}");
    }
}

/// With no collector listening, the run still ends, and its summary says the sends failed.
#[test]
fn a_run_with_no_collector_ends_and_says_so() {
    let dir = trace_in("sync-no-collector");
    // A port below the ephemeral range, where no test's collector can be given a port
    // (one bound and closed could go to the collector of a test running beside).
    let config = hh_config(&dir, "127.0.0.1:9", "");
    let out = ok(bin()
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .unwrap());
    assert!(
        out.contains("sends failed (is the collector listening?)"),
        "{out}"
    );
}

/// Settings that would promise what nothing keeps are refused, each naming the key.
#[test]
fn sync_settings_that_cannot_hold_are_refused() {
    let dir = tmp("sync-refused");
    std::fs::create_dir_all(&dir).unwrap();
    let run = |text: &str| {
        let config = dir.join("run.toml");
        std::fs::write(&config, text).unwrap();
        let out = bin()
            .args(["run", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{text}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let ports = "[[port]]\nname = \"in\"\nrx = \"none.pcap\"\n[[port]]\nname = \"out\"\n";
    let hh = "[program]\nname = \"hh\"\n[program.hh]\nmap = { in = \"out\" }\n";
    let synced = "[guarantees]\nsketch = [\"synced\"]\n";
    let cases = [
        (format!("{hh}{synced}{ports}"), "has no [sync] section"),
        (
            format!("{hh}[sync]\ncollector = \"127.0.0.1:7474\"\n{ports}"),
            "no state is synced",
        ),
        (
            format!("{hh}{synced}[sync]\ncollector = \"localhost\"\n{ports}"),
            "sync.collector: 'localhost' is not an address",
        ),
        (
            format!("{hh}{synced}[sync]\ncollector = \"127.0.0.1:0\"\n{ports}"),
            "sync.collector: '127.0.0.1:0' is not an address",
        ),
        (
            format!("{hh}{synced}[sync]\ncollector = \"0.0.0.0:7474\"\n{ports}"),
            "sync.collector: '0.0.0.0:7474' is not an address",
        ),
        (
            format!(
                "{hh}{synced}[sync]\ncollector = \"127.0.0.1:7474\"\nthreshold = \"fast\"\n{ports}"
            ),
            "sync.threshold: 'fast'",
        ),
        (
            format!("{hh}{synced}[sync]\ncollector = \"127.0.0.1:7474\"\nthreshold = -1\n{ports}"),
            "sync.threshold: -1 is below 0; give \"adaptive\" or a threshold of 0 or more",
        ),
        (
            format!("{hh}{synced}[sync]\ncollector = \"127.0.0.1:7474\"\nthreshold = 2.5\n{ports}"),
            "expected \"adaptive\" or a threshold of 0 or more",
        ),
        (
            format!(
                "{hh}{synced}[sync]\ncollector = \"127.0.0.1:7474\"\nthreshold = 8\nchannel_mbps = 10\n{ports}"
            ),
            "sync.channel_mbps: with threshold = 8 nothing uses it",
        ),
        (
            format!("{hh}{synced}[sync]\ncollector = \"127.0.0.1:7474\"\nrefresh_ms = 0\n{ports}"),
            "sync.refresh_ms: 0 is out of range",
        ),
        (
            format!(
                "{hh}{synced}[sync]\ncollector = \"127.0.0.1:7474\"\nkey_file = \"no.key\"\n{ports}"
            ),
            "sync.key_file: reading",
        ),
        (
            format!("{hh}{synced}[sync]\ncollector = \"127.0.0.1:7474\"\nchannel = 5\n{ports}"),
            "unknown field `channel`",
        ),
        (
            format!("[program]\nname = \"acl\"\n[guarantees]\nrules = [\"synced\"]\n{ports}"),
            "`rules` cannot be synced",
        ),
        (
            format!("{hh}[guarantees]\nsketch = [\"replicated\"]\n{ports}"),
            "`sketch` cannot be replicated linearizably yet",
        ),
    ];
    for (text, message) in cases {
        let err = run(&text);
        assert!(err.contains(message), "{message}: {err}");
    }
}

/// Row 0's total over both streams in `redis`: the packets counted.
fn counted(redis: &RedisServer) -> u64 {
    (0..2)
        .map(|stream| {
            let all = redis.cli(&["hgetall", &format!("stateplane:sync:1:{stream}:0")]);
            let words: Vec<&str> = all.lines().collect();
            (words.chunks(2))
                .filter(|kv| kv.len() == 2 && kv[0].parse::<u32>().is_ok_and(|i| i < 1024))
                .map(|kv| kv[1].parse::<u64>().unwrap())
                .sum::<u64>()
        })
        .sum()
}

/// With `--redis`, the copy is written through to a real Redis server as it is applied;
/// when Redis goes away the collector goes on (counting the failures), a switch that
/// starts again meanwhile is not mixed with its earlier run, and once Redis is back the
/// whole copy is written again; a switch that starts again while Redis stays has its
/// stream's hashes cleared, an earlier collector's too. A Redis URL with no server behind it is refused at start.
#[test]
fn the_copy_is_written_through_to_redis_and_survives_its_loss() {
    let dir = trace_in("sync-redis");
    let port = free_port();
    let mut redis = RedisServer::start(port, false).unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    let (collector, addr, collector_err) = start_collector(&["--redis", &url]);
    let config = hh_config(&dir, &addr, "");
    let run = || {
        ok(bin()
            .args(["run", "--config"])
            .arg(&config)
            .output()
            .unwrap())
    };
    run();
    let wait_for = |redis: &RedisServer, what: &str, done: &dyn Fn(&RedisServer) -> bool| {
        for _ in 0..250 {
            if done(redis) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("{what}: Redis holds {}", counted(redis));
    };
    wait_for(&redis, "the first run's copy", &|r| counted(r) == 30_000);
    let first_epoch = redis.cli(&["hget", "stateplane:sync:1:0", "epoch"]);

    // Redis goes; the switch runs again (a new epoch) while it is away; Redis comes back
    // empty, and gets the whole copy of the second run, not a sum of the two.
    redis.kill();
    run();
    redis.restart().unwrap();
    wait_for(&redis, "the copy written again", &|r| counted(r) == 30_000);
    let epoch = redis.cli(&["hget", "stateplane:sync:1:0", "epoch"]);
    assert_ne!(epoch, first_epoch, "the second run's epoch");

    // An earlier collector's hash of a state this one never wrote, in the stream's set of
    // states; the switch runs again with Redis staying: every hash of the stream goes
    // (that one too, with no scan of the keyspace), and the copy is the third run's alone.
    redis.cli(&["hset", "stateplane:sync:1:0:7", "0", "5"]);
    redis.cli(&["sadd", "stateplane:sync:1:0:states", "7"]);
    run();
    wait_for(&redis, "the third run's copy", &|r| {
        r.cli(&["hget", "stateplane:sync:1:0", "epoch"]) != epoch && counted(r) == 30_000
    });
    assert_eq!(redis.cli(&["exists", "stateplane:sync:1:0:7"]).trim(), "0");
    let states = redis.cli(&["smembers", "stateplane:sync:1:0:states"]);
    assert_eq!(
        states.trim(),
        "0",
        "the states the stream has now: {states}"
    );
    let table = stop_collector(collector, collector_err);
    let line = table.lines().find(|l| l.starts_with("redis: ")).unwrap();
    assert!(!line.contains(" 0 errors"), "{table}");
    assert!(table.contains("restarts 4"), "{table}");

    // The collector refuses a copy at `url` with `message`, after the flag's name.
    let collector_refuses = |url: &str, message: &str| {
        let args = ["collector", "--listen", "127.0.0.1:0", "--redis", url];
        let err = refused(&args, message);
        assert!(err.contains("--redis"), "{err}");
    };
    let nobody = format!("redis://127.0.0.1:{}", free_port());
    collector_refuses(&nobody, "is redis-server running there?");
    // A server that evicts keys would lose the copy's values: refused with the fix.
    let evicting = RedisServer::start_with(
        free_port(),
        false,
        &["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"],
    )
    .unwrap();
    collector_refuses(&evicting.url(), "maxmemory-policy noeviction");
    // Nor is the copy written to a Redis Cluster: a node of one is refused.
    let cluster = RedisServer::cluster().unwrap();
    collector_refuses(&cluster[0].url(), "a node of a Redis Cluster");
}

/// hh's run of `dir` to a collector started with `collector_args`: its copy, 30,000
/// packets counted, reaches `redis` (within 5 s), with no error at the collector.
fn copy_reaches(dir: &std::path::Path, redis: &RedisServer, collector_args: &[&str]) {
    let (collector, addr, collector_err) = start_collector(collector_args);
    ok(bin()
        .args(["run", "--config"])
        .arg(hh_config(dir, &addr, ""))
        .output()
        .unwrap());
    for _ in 0..250 {
        if counted(redis) == 30_000 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(counted(redis), 30_000);
    let table = stop_collector(collector, collector_err);
    assert!(table.contains(" 0 errors"), "{table}");
}

/// With `--redis rediss://...`, the copy goes to Redis over TLS: the collector trusts the
/// server through `--redis-ca` and shows `--redis-cert` to a server that asks for one;
/// without the CA it is refused at start, naming `--redis-ca`; TLS files with no TLS
/// connection to guard are refused by name.
#[test]
fn the_copy_is_written_through_to_redis_over_tls() {
    let dir = trace_in("sync-redis-tls");
    let pki = stateplane_test_pki::TestPki::new("sync-redis-tls").unwrap();
    let redis =
        RedisServer::start_tls(free_port(), free_port(), &pki.server_files(), true).unwrap();
    let url = redis.tls_url().unwrap();
    let (client_cert, client_key) = (pki.path("client.pem"), pki.path("client.key"));
    let path = |p: &std::path::Path| p.display().to_string();
    let (ca, client_cert, client_key) = (
        path(&pki.path("ca.pem")),
        path(&client_cert),
        path(&client_key),
    );
    let tls = [
        "--redis-ca",
        &ca,
        "--redis-cert",
        &client_cert,
        "--redis-key",
        &client_key,
    ];
    // Read through the server's plain port.
    copy_reaches(
        &dir,
        &redis,
        &[&["--redis", url.as_str()][..], &tls[..]].concat(),
    );

    let refused = |args: &[&str], message: &str| {
        refused(
            &[&["collector", "--listen", "127.0.0.1:0"], args].concat(),
            message,
        );
    };
    refused(
        &["--redis", &url],
        "give the certificate of the CA that signed it (PEM) as --redis-ca",
    );
    refused(
        &["--redis-ca", &ca],
        "--redis-ca: it is for the connection to --redis",
    );
    let plain = url.replace("rediss://", "redis://");
    refused(
        &["--redis", &plain, "--redis-ca", &ca],
        "--redis-ca: --redis",
    );
    refused(
        &[
            "--redis",
            &url,
            "--redis-ca",
            &ca,
            "--redis-cert",
            &client_cert,
        ],
        "--redis-cert: a client certificate needs its key",
    );
}

/// With `--redis redis+sentinel://...`, the copy goes to the master the sentinel names.
#[test]
fn the_copy_is_written_through_to_the_master_redis_sentinel_names() {
    let dir = trace_in("sync-redis-sentinel");
    let master = RedisServer::start(free_port(), false).unwrap();
    let sentinel = RedisServer::sentinel(free_port(), "copy", master.port()).unwrap();
    let url = format!("redis+sentinel://127.0.0.1:{}/copy", sentinel.port());
    copy_reaches(&dir, &master, &["--redis", &url]);
}

/// A collector holds at most `--max-locations`: a switch whose synced sketch is larger
/// than that (two workers of 2,048 counters into room for 3,000: one worker's stream fits)
/// has the messages past it refused as `full`, counted in the summary, and the collector
/// applies the rest; a limit too small
/// for one stream is refused by name.
#[test]
fn a_collector_past_its_location_limit_refuses_and_counts_and_goes_on() {
    let dir = trace_in("sync-full");
    let (collector, addr, collector_err) = start_collector(&["--max-locations", "3000"]);
    run_json(&hh_config(&dir, &addr, ""));
    let table = stop_collector(collector, collector_err);
    let refused = table.lines().find(|l| l.starts_with("refused")).unwrap();
    let full: u64 = (refused.split(", "))
        .find_map(|r| r.rsplit_once("full ").map(|(_, n)| n))
        .unwrap_or_else(|| panic!("no full refusals: {table}"))
        .parse()
        .unwrap();
    assert!(full > 0, "{table}");
    let held: usize = (table.lines())
        .filter_map(|l| {
            l.rsplit_once("locations held ")
                .map(|(_, n)| n.parse::<usize>().unwrap())
        })
        .sum();
    assert!((2048..=3000).contains(&held), "{table}");
    let out = bin()
        .args(["collector", "--max-locations", "10"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--max-locations: 10 is too few to hold one stream; give at least 64"),
        "{err}"
    );
}

/// The collector's flags that cannot hold are refused before it listens, each naming the
/// flag and the fix: a dump into a folder that does not exist was found only at the end of
/// the run, its copy lost.
#[test]
fn collector_flags_that_cannot_hold_are_refused_before_it_listens() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--seconds", "0"],
            "--seconds: 0 is not a length to run for; give more than 0",
        ),
        (
            &["--seconds=-3"],
            "--seconds: -3 is not a length to run for",
        ),
        (
            &["--dump", "/nonexistent-folder/copy.csv", "--seconds", "30"],
            "--dump /nonexistent-folder/copy.csv: No such file or directory (os error 2): give a path in a folder this user can write",
        ),
        (
            &["--listen", "127.0.0.1"],
            "--listen: '127.0.0.1' is not an address like 127.0.0.1:7474",
        ),
    ];
    for (args, message) in cases {
        let err = refused(&[&["collector"], args].concat(), message);
        assert!(!err.contains("collector listening"), "{args:?}: {err}");
    }
}

/// The relay refuses a target datagrams cannot go to (port 0, an unspecified address) and
/// its own address, which would send what it relays back to itself: the address it
/// listens at, or, listening at every address of the host, its port at one of them.
#[test]
fn relay_targets_that_cannot_hold_are_refused() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (everywhere, everywhere6) = (format!("0.0.0.0:{port}"), format!("[::]:{port}"));
    let cases = [
        (
            listen.as_str(),
            "127.0.0.1:0",
            "--to: '127.0.0.1:0' is not an address like 127.0.0.1:7474",
        ),
        (
            listen.as_str(),
            "0.0.0.0:7474",
            "--to: '0.0.0.0:7474' is not an address like 127.0.0.1:7474",
        ),
        (listen.as_str(), listen.as_str(), "the relay's own address"),
        (
            everywhere.as_str(),
            listen.as_str(),
            "the relay's own address",
        ),
        (
            everywhere6.as_str(),
            listen.as_str(),
            "the relay's own address",
        ),
    ];
    for (listen, to, message) in cases {
        refused(
            &["relay", "--listen", listen, "--to", to, "--seconds", "30"],
            message,
        );
    }
}

/// `ctl sync`'s own arguments are checked before it reaches for the collector, so that a
/// wrong one is told as such (here no collector listens): a watch's timeout that is no
/// length of time, a range past a state's indexes, a write larger than any switch stages,
/// values that do not fill the range.
#[test]
fn ctl_sync_arguments_are_checked_before_the_collector_is_reached() {
    let server = format!("127.0.0.1:{}", free_port());
    let cases: [(&[&str], &str); 5] = [
        (
            &["watch", "--timeout=-1"],
            "--timeout: -1 is not a time to wait",
        ),
        (
            &["read", "--switch", "1", "0..99999999999"],
            "0..99999999999: 99999999999 locations, past what a state's 32-bit indexes reach",
        ),
        (
            &[
                "write",
                "--switch",
                "1",
                "--state",
                "0",
                "--fill",
                "1",
                "0..1048577",
            ],
            "0..1048577: 1048577 locations; a write holds at most 1048576 values",
        ),
        (
            &[
                "write", "--switch", "1", "--state", "0", "--values", "1", "0..2",
            ],
            "--values: 1 values for the 2 locations of 0..2",
        ),
        (
            &[
                "write", "--switch", "1", "--state", "0", "--fill", "1", "0..10",
            ],
            "cannot reach the collector's API",
        ),
    ];
    for (args, message) in cases {
        refused(
            &[&["ctl", "--server", &server, "sync"], args].concat(),
            message,
        );
    }
}

/// Through the collector's API (`ctl sync`): a subscription sees the changes as they are
/// applied, a read sums a switch's streams into the packets counted, and the streams are
/// listed with their epochs; asking for a switch that never sent is refused by name.
#[test]
fn the_collector_api_streams_reads_and_follows_changes() {
    let dir = trace_in("sync-api");
    let api = format!("127.0.0.1:{}", free_port());
    let (collector, addr, collector_err) = start_collector(&["--api", &api]);
    let ctl = |args: &[&str]| {
        let mut command = bin();
        command
            .args(["ctl", "-s", &api, "sync"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    };
    let mut watch = ctl(&["watch", "--count", "5", "--timeout", "20"])
        .spawn()
        .unwrap();
    // The switch runs until the watch has seen its 5 changes (however long the watch takes
    // to subscribe): each run starts its streams over, and the reads below are of the last.
    let config = hh_config(&dir, &addr, "");
    for _ in 0..50 {
        run_json(&config);
        if watch.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let watched = ok(watch.wait_with_output().unwrap());
    let changes: Vec<&str> = watched
        .lines()
        .filter(|l| l.starts_with("switch 1 stream "))
        .collect();
    assert_eq!(changes.len(), 5, "{watched}");
    // The switch runs once more, its changes going to a subscription whose client has
    // gone: that connection ends, never the collector (stop_collector checks it is still
    // running; with SIGPIPE's default action a write to the closed socket killed it).
    let forwarded = run_json(&config)["counters"]["tx_packets"]
        .as_u64()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Row 0 of sketch 0, both workers summed: every packet forwarded, exactly.
    let read = ok(ctl(&["read", "0..1024"]).output().unwrap());
    let mut counted = 0u64;
    for line in read.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[2], "±0", "{line}");
        counted += words[1].parse::<u64>().unwrap();
    }
    assert_eq!(counted, forwarded, "{read}");
    // A reader that goes after one line (`| head -1`) of more than a pipe holds ends the
    // command quietly.
    let mut head = ctl(&["read", "0..200000"]).spawn().unwrap();
    let mut first = String::new();
    BufReader::new(head.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let ended = head.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&ended.stderr);
    assert!(first.starts_with("0 "), "{first}");
    assert!(!err.contains("panicked"), "{err}");
    let streams = ok(ctl(&["streams"]).output().unwrap());
    assert_eq!(
        streams.lines().skip(1).count(),
        2,
        "a stream per worker: {streams}"
    );
    assert!(
        (streams.lines().skip(1)).all(|l| l.trim_start().starts_with("1 ")),
        "switch 1's: {streams}"
    );
    assert!(
        (streams.lines().skip(1)).all(|l| l.ends_with("  0=4096x1")),
        "the sketch announced, 2 sketches of 2 rows of 1,024 counters: {streams}"
    );
    let out = ctl(&["read", "--switch", "9", "0..4"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("switch 9 has sent nothing"), "{err}");
    let out = ctl(&["migrate", "--from-switch", "9", "--to-switch", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("switch 9 stream 0 has sent nothing to this collector"),
        "{err}"
    );
    // The switch's run has ended: a write to it is never acknowledged; at its timeout it
    // is cancelled, the cancel goes unanswered, and the message says so.
    let out = ctl(&["write", "0..4", "--fill", "0", "--timeout-ms", "200"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "streams [0, 1] had not committed the write after 200 ms, so it was cancelled"
        ),
        "a write to each of the two workers' streams: {err}"
    );
    assert!(
        err.contains("the cancel is unanswered (the switch may be gone)"),
        "{err}"
    );
    // The sketch applications refuse what they cannot watch, naming the setting, and a
    // switch that cannot be reached, before they touch anything.
    let keys = dir.join("keys.txt");
    std::fs::write(
        &keys,
        "src=198.18.0.1 dst=198.18.0.2 proto=17 src_port=1 dst_port=2 vlan=0\n",
    )
    .unwrap();
    let keys = keys.to_string_lossy().into_owned();
    for (args, says) in [
        (
            vec!["udpflood", "--protect", "198.18.0.0/15", "--threshold", "5"],
            "--protect: more than 65536 addresses; give longer prefixes",
        ),
        (
            vec!["udpflood", "--protect", "198.18.0.300", "--threshold", "5"],
            "--protect: '198.18.0.300' is not an address or a prefix",
        ),
        (
            vec!["udpflood", "--protect", "198.18.0.0/33", "--threshold", "5"],
            "is not an address or a prefix ADDRESS/LENGTH",
        ),
        (
            vec!["hh", "--keys", "/nonexistent/keys", "--threshold", "5"],
            "--keys /nonexistent/keys:",
        ),
        (
            vec!["hh", "--keys", &keys, "--threshold", "0"],
            "--threshold",
        ),
        (
            vec![
                "hh",
                "--keys",
                &keys,
                "--threshold",
                "5",
                "--control",
                "127.0.0.1:1",
            ],
            "127.0.0.1:1",
        ),
    ] {
        let out = ctl(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            err.contains(says) && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    stop_collector(collector, collector_err);
    // The API has no authentication: an address off loopback is refused, with the fix.
    let out = bin()
        .args([
            "collector",
            "--listen",
            "127.0.0.1:0",
            "--api",
            "198.18.0.1:9570",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--api: the collector API has no authentication"),
        "{err}"
    );
    assert!(err.contains("give 127.0.0.1:9570 instead"), "{err}");
}

/// The sync experiments run small, end to end: each checks its own work before it prints
/// (Lemma 1 for every key; every write committed and each target holding the source's
/// values; the collector's copy counting every packet forwarded), so a run that prints its
/// table has passed those checks.
#[test]
fn the_sync_experiments_check_their_work_and_print_their_tables() {
    let hh = ok(bin()
        .args(["bench-sync-hh", "--flows", "10000", "--seconds", "0.3"])
        .output()
        .unwrap());
    assert!(hh.contains("sync, t adaptive, estimate + bound"), "{hh}");
    assert!(hh.contains("Lemma 1 at every sample"), "{hh}");
    // The ways at two losses, each run's books checked before the table prints.
    let csv = tmp("sync-reorder.csv");
    let reorder = ok(bin()
        .args(["bench-sync-reorder", "--flows", "10000", "--seconds", "0.5"])
        .args(["--losses", "0,0.5", "--csv"])
        .arg(&csv)
        .output()
        .unwrap());
    assert!(
        reorder.contains("every increment is in the counters"),
        "{reorder}"
    );
    // Per loss and way: the reset as the engine cuts it (one part of a run of zeros) and
    // in parts of 1,408 values. In parts, the paper's deferral reorders what keeping the
    // changes applies at once, losing no more; as one part, nothing is on its way to
    // defer for.
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows: BTreeMap<(String, String, String), Vec<String>> = (text.lines().skip(1))
        .map(|line| {
            let f: Vec<String> = line.split(',').map(str::to_owned).collect();
            ((f[0].clone(), f[1].clone(), f[2].clone()), f)
        })
        .collect();
    let field = |loss: &str, way: &str, cut: &str, column: usize| -> u64 {
        let row = &rows[&(loss.to_owned(), way.to_owned(), cut.to_owned())];
        row[column].parse().unwrap()
    };
    let (intervals, made, lost, reordered, parts) = (3, 4, 5, 6, 8);
    for loss in ["0", "0.5"] {
        let in_parts = |way, column| field(loss, way, "1408 a part", column);
        assert!(in_parts("keep", made) > 0, "{text}");
        assert!(
            in_parts("defer", reordered) > 0,
            "the paper's reorders: {text}"
        );
        assert_eq!(in_parts("keep", reordered), 0, "{text}");
        assert_eq!(in_parts("keep", lost), in_parts("defer", lost), "{text}");
        assert!(in_parts("set", lost) > in_parts("keep", lost), "{text}");
        assert_eq!(field(loss, "defer", "runs", reordered), 0, "{text}");
        assert!(field(loss, "subtract", "runs", made) > 0, "{text}");
        assert_eq!(field(loss, "subtract", "runs", lost), 0, "{text}");
        assert_eq!(field(loss, "subtract", "runs", reordered), 0, "{text}");
        // 12 parts a reset (the last one issued as the run ends).
        assert!(
            field(loss, "defer", "1408 a part", parts)
                >= 12 * (field(loss, "defer", "1408 a part", intervals) - 1),
            "{text}"
        );
    }
    // One part a reset on a path that loses nothing (the first write's sent again once:
    // its timeout is the engine's first guess, shorter than this path's round trip).
    assert!(
        field("0", "keep", "runs", parts) <= field("0", "keep", "runs", intervals) + 1,
        "{text}"
    );
    // Settings that cannot run are refused by name, never taken as something else (a
    // capacity of 0 would be a channel with no limit; a timeout of 0 the default's 1000).
    for (args, named) in [
        (&["bench-sync-reorder", "--capacity", "0"][..], "--capacity"),
        (&["bench-sync-reorder", "--width", "0"][..], "--width"),
        (
            &["bench-sync-reorder", "--values-per-part", "0"][..],
            "--values-per-part",
        ),
        (&["bench-sync-hh", "--share", "1"][..], "--share"),
        (
            &[
                "ctl",
                "sync",
                "write",
                "0..4",
                "--fill",
                "0",
                "--timeout-ms",
                "0",
            ][..],
            "--timeout-ms",
        ),
    ] {
        let out = bin().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(named),
            "{args:?}: {err}"
        );
    }
    // A table's rows: the lines whose first word is a loss.
    let rows = |table: &str| -> Vec<String> {
        (table.lines())
            .filter(|l| {
                l.split_whitespace()
                    .next()
                    .is_some_and(|w| w.ends_with('%'))
            })
            .map(str::to_string)
            .collect()
    };
    // Two sizes at two losses: four rows, each move checked before the table prints.
    for (mode, checked) in [
        (None, "each target's register is the source's values"),
        (
            Some("--table"),
            "each target's table holds every connection of the source",
        ),
    ] {
        let moved = ok(bin()
            .args(["bench-sync-migrate", "--sizes", "256,1024"])
            .args(["--losses", "0,0.5", "--moves", "2"])
            .args(mode)
            .output()
            .unwrap());
        assert!(moved.contains(checked), "{moved}");
        assert_eq!(rows(&moved).len(), 4, "{moved}");
        // Each move's commit is timed, and the target's longest pause in forwarding holds
        // it: a commit is made within one of the sync stage's calls between two bursts.
        for row in rows(&moved) {
            let figures: Vec<f64> = (row.split_whitespace().skip(2))
                .map(|f| f.parse().unwrap())
                .collect();
            let (first_move_ms, commit_ms, first_commit_ms, pause_ms) =
                (figures[2], figures[4], figures[5], figures[6]);
            assert!(commit_ms > 0.0 && pause_ms >= commit_ms, "{row}");
            assert!(
                first_move_ms > first_commit_ms && first_commit_ms > 0.0,
                "{row}"
            );
        }
    }
    // The whole sketch by `ctl sync migrate`'s call: one row a loss, checked the same way.
    let migrated = ok(bin()
        .args(["bench-sync-migrate", "--migrate", "--sizes", "65536"])
        .args(["--losses", "0,0.5", "--moves", "2"])
        .output()
        .unwrap());
    assert!(
        migrated.contains("moved whole by ctl sync migrate's call"),
        "{migrated}"
    );
    assert!(
        migrated.contains("each target's register is the source's values"),
        "{migrated}"
    );
    assert_eq!(rows(&migrated).len(), 2, "{migrated}");
    let refused = bin()
        .args(["bench-sync-migrate", "--migrate", "--sizes", "256"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("give --sizes 65536"), "{why}");
    // Long enough (a few hundred ms) for writes every 10 ms to commit.
    let cost = |program: &[&str]| {
        ok(bin()
            .args(["bench-sync-cost", "--packets", "100000", "--loops", "40"])
            .args(["--repeat", "1", "--thresholds", "adaptive"])
            .args(program)
            .output()
            .unwrap())
    };
    let hh = cost(&[]);
    assert!(
        hh.contains("sync on, t adaptive, writes every 10 ms"),
        "{hh}"
    );
    assert!(
        hh.contains("counts every packet forwarded, exactly"),
        "{hh}"
    );
    let counter = cost(&[
        "--program",
        "counter",
        "--max-age-ms",
        "100",
        "--capacity",
        "65536",
    ]);
    assert!(
        counter.contains("counter, its flows synced (65536 per worker")
            && counter.contains("sync on, t adaptive, writes every 10 ms"),
        "{counter}"
    );
    // A setting of the other program is refused, not ignored.
    for (program, other) in [("counter", "--width"), ("hh", "--capacity")] {
        let out = bin()
            .args(["bench-sync-cost", "--program", program, other, "8"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(other), "{err}");
    }
}
