//! The `replicated` guarantee through the binary: its store benchmark against a real
//! redis-server (the test command installs it; its absence fails the test).
#![allow(clippy::unwrap_used)]

mod common;

use common::{bin, ok, refused, tmp};

/// `bench-replication-store` measures both stores at each depth, checks that each holds
/// every flow's last write, and writes its CSV and chart; bad flags are refused by name.
#[test]
fn bench_replication_store_measures_both_stores_and_checks_their_records() {
    let csv = tmp("replication-store.csv");
    let svg = tmp("replication-store.svg");
    let stdout = ok(bin()
        .args([
            "bench-replication-store",
            "--writes",
            "2000",
            "--flows",
            "300",
        ])
        .args(["--depths", "1,64", "--repeat", "1", "--csv"])
        .arg(&csv)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap());
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(rows.len(), 4, "{text}");
    for (store, depth) in [("memory", 1), ("memory", 64), ("redis", 1), ("redis", 64)] {
        let row = (rows.iter())
            .find(|r| r.starts_with(&format!("{store},{depth},")))
            .unwrap_or_else(|| panic!("no {store} depth {depth} in {text}"));
        let rate: f64 = row.split(',').nth(2).unwrap().parse().unwrap();
        assert!(rate > 0.0, "{row}");
    }
    assert!(stdout.contains("round trip p50 us"), "{stdout}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));

    refused(
        &["bench-replication-store", "--depths", "0"],
        "--depths: '0' is not a depth from 1 to 65536",
    );
    refused(
        &["bench-replication-store", "--redis", "redis://127.0.0.1:1/"],
        "is redis-server running there?",
    );
}

/// A generated trace of `packets` over `flows` flows, and the configuration of `counter`
/// forwarding it from p0 to p1 (`out` the output capture), `extra` appended.
fn counter_run(
    name: &str,
    packets: u64,
    flows: u64,
    extra: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let trace = tmp(&format!("{name}.pcap"));
    if !trace.exists() {
        ok(bin()
            .args(["gen", "internet", "--packets", &packets.to_string()])
            .args(["--flows", &flows.to_string(), "-o"])
            .arg(&trace)
            .output()
            .unwrap());
    }
    let out = tmp(&format!("{name}-{}.pcap", extra.len()));
    let config = tmp(&format!("{name}-{}.toml", extra.len()));
    std::fs::write(
        &config,
        format!(
            "[program]\nname = \"counter\"\n[program.counter]\nmap = {{ p0 = \"p1\" }}\n\
             [[port]]\nname = \"p0\"\nrx = \"{}\"\n[[port]]\nname = \"p1\"\ntx = \"{}\"\n{extra}",
            trace.display(),
            out.display()
        ),
    )
    .unwrap();
    (config, out)
}

fn run_json(config: &std::path::Path) -> serde_json::Value {
    let stdout = ok(bin()
        .args(["run", "--json", "--config"])
        .arg(config)
        .output()
        .unwrap());
    serde_json::from_str(&stdout).unwrap()
}

const REPLICATED: &str = "[guarantees]\nflows = [\"replicated\"]\n";

/// `counter` with its flows replicated on the embedded memory store forwards exactly what
/// it forwards unreplicated, in the same order, every output after its write: one write
/// a flow a burst, the other packets' changes folded in.
#[test]
fn counter_replicated_on_the_memory_store_forwards_what_it_forwards_unreplicated() {
    let (plain, plain_out) = counter_run("rep-memory", 20_000, 500, "");
    let (replicated, replicated_out) = counter_run("rep-memory", 20_000, 500, REPLICATED);
    let unreplicated = run_json(&plain);
    assert!(unreplicated.get("replication").is_none());
    let summary = run_json(&replicated);
    assert_eq!(
        std::fs::read(&plain_out).unwrap(),
        std::fs::read(&replicated_out).unwrap(),
        "the same packets out, in the same order"
    );
    let r = &summary["replication"];
    assert_eq!(r["store"], "memory");
    assert_eq!(r["processed"], 20_000);
    assert_eq!(
        r["waited_for_store"], 20_000,
        "every packet of counter writes"
    );
    assert_eq!(r["dropped"], 0);
    let (writes, folded) = (
        r["writes"].as_u64().unwrap(),
        r["coalesced"].as_u64().unwrap(),
    );
    assert_eq!(
        writes + folded,
        20_000,
        "each packet's change written or folded: {r}"
    );
    assert!(folded > 0, "{r}");
}

/// Every record of a Redis store: each flow's packets and bytes (counter's state: its
/// action, then packets and bytes as 16 bytes each).
fn redis_counts(url: &str) -> Vec<(u64, u64)> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("stateplane:rep:*")
        .query(&mut conn)
        .unwrap();
    keys.iter()
        .map(|k| {
            let v: Vec<u8> = redis::cmd("HGET").arg(k).arg("v").query(&mut conn).unwrap();
            assert_eq!(v.len(), 33, "{k}: {v:?}");
            let word = |at: usize| u64::from_le_bytes(v[at..at + 8].try_into().unwrap());
            (word(1), word(17))
        })
        .collect()
}

/// Replicated to a real Redis, every packet counted is in the store when the run ends;
/// a second switch process run on the same store takes each flow over once the first's
/// leases have passed, with its counts, and counts on from them.
#[test]
fn counter_replicated_to_redis_leaves_every_count_in_the_store_for_the_next_switch() {
    let server = stateplane_lab::RedisServer::start(free_port(), false).unwrap();
    let store = format!(
        "{REPLICATED}[replication]\nstore = \"{}\"\nlease_ms = 300\n",
        server.url()
    );
    let (config, _) = counter_run("rep-redis", 5_000, 200, &store);
    let first = run_json(&config);
    let packets_in = first["counters"]["rx_packets"].as_u64().unwrap();
    assert_eq!(first["counters"]["tx_packets"].as_u64(), Some(packets_in));
    let counts = redis_counts(&server.url());
    assert_eq!(
        counts.iter().map(|c| c.0).sum::<u64>(),
        packets_in,
        "{first}"
    );
    let flows = counts.len();
    assert!(flows > 100, "{flows} flows");

    let second = run_json(&config);
    let r = &second["replication"];
    assert_eq!(
        r["migrated"].as_u64(),
        Some(flows as u64),
        "each flow came with its state: {r}"
    );
    assert_eq!(r["dropped"], 0);
    assert!(
        r["waited"].as_u64().unwrap() > 0,
        "the first run's leases ran: {r}"
    );
    let counts = redis_counts(&server.url());
    assert_eq!(counts.len(), flows);
    assert_eq!(counts.iter().map(|c| c.0).sum::<u64>(), 2 * packets_in);
}

/// What replication cannot keep yet, or is given wrong, is refused by name with the fix.
#[test]
fn replication_settings_that_nothing_keeps_are_refused() {
    let cases = [
        (
            format!("{REPLICATED}[replication]\nmode = \"bounded\"\n"),
            "'bounded' (periodic snapshots) is not built yet",
        ),
        (
            format!("{REPLICATED}[replication]\nmode = \"eventual\"\n"),
            "replication.mode: 'eventual' is not a mode",
        ),
        (
            format!("{REPLICATED}[replication]\nlease_ms = 50\n"),
            "replication.lease_ms: 50 is outside 100 to 60000",
        ),
        (
            format!("{REPLICATED}[replication]\nstore = \"etcd://x\"\n"),
            "replication.store: 'etcd://x' is not a store",
        ),
        (
            format!("{REPLICATED}[replication]\nstore = \"redis://127.0.0.1:1/\"\n"),
            "is redis-server running there?",
        ),
        (
            format!("{REPLICATED}[replication]\nwait_replicas = 1\n"),
            "the memory store has no replicas",
        ),
        (
            format!("{REPLICATED}[replication]\nstore = \"memory\"\ncolour = 1\n"),
            "unknown field `colour`",
        ),
        (
            "[replication]\nstore = \"memory\"\n".to_string(),
            "a [replication] section, but no state is replicated",
        ),
    ];
    for (i, (extra, message)) in cases.iter().enumerate() {
        let (config, _) = counter_run(&format!("rep-refused-{i}"), 10, 2, extra);
        let out = bin()
            .args(["run", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(message),
            "{message}: {err}"
        );
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
