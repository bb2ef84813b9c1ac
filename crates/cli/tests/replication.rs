//! The `replicated` guarantee through the binary: its store benchmark against a real
//! redis-server (the test command installs it; its absence fails the test).
#![allow(clippy::unwrap_used)]

mod common;

use common::{bin, free_port, ok, refused, tmp};

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
    assert_eq!(rows.len(), 6, "{text}");
    for store in ["memory", "redis", "redis-batched"] {
        for depth in [1, 64] {
            let row = (rows.iter())
                .find(|r| r.starts_with(&format!("{store},{depth},")))
                .unwrap_or_else(|| panic!("no {store} depth {depth} in {text}"));
            let rate: f64 = row.split(',').nth(2).unwrap().parse().unwrap();
            assert!(rate > 0.0, "{row}");
        }
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
    refused(
        &["bench-replication-store", "--redis-ca", "/etc/hostname"],
        "--redis-ca: it is for the connection to --redis",
    );
    refused(
        &[
            "bench-replication-store",
            "--tls",
            "--redis",
            "redis://127.0.0.1:1/",
        ],
        "--tls: it measures the run's own server over TLS",
    );
}

/// With `--tls`, the run's own server is measured over TLS too, beside plain text, every
/// write of both checked.
#[test]
fn bench_replication_store_measures_its_own_server_over_tls_beside_plain_text() {
    let csv = tmp("replication-store-own-tls.csv");
    ok(bin()
        .args(["bench-replication-store", "--tls", "--writes", "1000"])
        .args(["--flows", "100", "--depths", "16", "--repeat", "1", "--csv"])
        .arg(&csv)
        .output()
        .unwrap());
    let text = std::fs::read_to_string(&csv).unwrap();
    for store in ["redis", "redis-batched", "redis-tls", "redis-batched-tls"] {
        let row = (text.lines())
            .find(|r| r.starts_with(&format!("{store},16,")))
            .unwrap_or_else(|| panic!("no {store} in {text}"));
        let rate: f64 = row.split(',').nth(2).unwrap().parse().unwrap();
        assert!(rate > 0.0, "{row}");
    }
}

/// A redis-server over TLS that asks for a client certificate (the PKI's), with an ACL
/// user `user` whose password is `secret`; its TLS URL as that user.
fn tls_server_with_user(
    pki: &stateplane_test_pki::TestPki,
    user: &str,
    secret: &str,
) -> (stateplane_lab::RedisServer, String) {
    let server =
        stateplane_lab::RedisServer::start_tls(free_port(), free_port(), &pki.server_files(), true)
            .unwrap();
    server.cli(&[
        "acl",
        "setuser",
        user,
        "on",
        &format!(">{secret}"),
        "~*",
        "&*",
        "+@all",
    ]);
    let url =
        (server.tls_url().unwrap()).replace("rediss://", &format!("rediss://{user}:{secret}@"));
    (server, url)
}

/// The standard output of a command that succeeded, `secret` shown in none of its output.
fn ok_without(out: std::process::Output, secret: &str) -> String {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stdout.contains(secret) && !stderr.contains(secret),
        "{stdout}{stderr}"
    );
    stdout
}

/// `bench-replication-store --redis rediss://...` measures a store behind TLS that asks
/// for a client certificate, as an ACL user with a password, which it never shows.
#[test]
fn bench_replication_store_measures_a_store_over_tls_without_showing_its_password() {
    let pki = stateplane_test_pki::TestPki::new("bench-store-tls").unwrap();
    let (_server, url) = tls_server_with_user(&pki, "bench", "bench-secret-7");
    let csv = tmp("replication-store-tls.csv");
    let out = bin()
        .args([
            "bench-replication-store",
            "--writes",
            "500",
            "--flows",
            "50",
        ])
        .args([
            "--depths",
            "1,16",
            "--repeat",
            "1",
            "--redis",
            &url,
            "--redis-ca",
        ])
        .arg(pki.path("ca.pem"))
        .arg("--redis-cert")
        .arg(pki.path("client.pem"))
        .arg("--redis-key")
        .arg(pki.path("client.key"))
        .arg("--csv")
        .arg(&csv)
        .output()
        .unwrap();
    ok_without(out, "bench-secret-7");
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.lines().any(|l| l.starts_with("redis,16,")), "{text}");
}

/// Writes the trace of `stateplane gen ARGS` (`args` split at spaces) to `trace`.
fn generate(trace: &std::path::Path, args: &str) {
    ok(bin()
        .arg("gen")
        .args(args.split_whitespace())
        .arg("-o")
        .arg(trace)
        .output()
        .unwrap());
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
        generate(
            &trace,
            &format!("internet --packets {packets} --flows {flows}"),
        );
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

/// `stateplane run --json` on `config`, its output and errors piped, not waited for.
fn spawn_run(config: &std::path::Path) -> std::process::Child {
    bin()
        .args(["run", "--json", "--config"])
        .arg(config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

const REPLICATED: &str = "[guarantees]\nflows = [\"replicated\"]\n";

/// A run's JSON summary's packets in, out and dropped.
fn in_out_dropped(summary: &serde_json::Value) -> (u64, u64, u64) {
    let c = &summary["counters"];
    let count = |name: &str| c[name].as_u64().unwrap();
    (count("rx_packets"), count("tx_packets"), count("dropped"))
}

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

/// Past `park_limit` held packets, a packet is dropped and counted (`unreplicated`), never
/// lost without a count, and the worker holds at most the limit and a burst's room more
/// (128: with a stage that holds packets a worker's burst has room for twice `burst`),
/// outputs waiting for this burst's writes and drops on their way out: with room for 8,
/// new flows waiting for their leases and outputs waiting for their writes overflow it.
/// With a history a flow's held packets go one a burst, so packets arriving behind them
/// would pile up past the bound if the stage did not drop them.
#[test]
fn past_the_park_limit_packets_are_dropped_and_counted() {
    let store = format!("{REPLICATED}[replication]\npark_limit = 8\n");
    for (flows, history) in [(200, false), (4, true)] {
        let (config, _) = counter_run(&format!("rep-park-{flows}"), 5_000, flows, &store);
        let mut run = bin();
        run.args(["run", "--json", "--config"]).arg(&config);
        if history {
            run.arg("--history").arg(tmp("rep-park.jsonl"));
        }
        let summary: serde_json::Value = serde_json::from_str(&ok(run.output().unwrap())).unwrap();
        let (c, r) = (&summary["counters"], &summary["replication"]);
        let dropped = r["dropped"].as_u64().unwrap();
        assert!(dropped > 0, "{r}");
        assert!(r["held_most"].as_u64().unwrap() <= 8 + 128, "{r}");
        assert_eq!(summary["drops"]["unreplicated"].as_u64(), Some(dropped));
        assert_eq!(
            c["rx_packets"].as_u64().unwrap(),
            c["tx_packets"].as_u64().unwrap() + dropped,
            "{summary}"
        );
    }
}

/// A run from a capture reads far faster than a store answers; it waits for the store
/// rather than drop what overflows the park bound (live ports cannot wait, and drop and
/// count). `kv` through Redis with room for 1,000 held packets, on a trace whose keys
/// are mostly new to the run (each waits for its lease): nothing is dropped, everything
/// the unreplicated run forwards is forwarded, and the worker never held past its bound.
#[test]
fn a_capture_read_faster_than_the_store_answers_waits_for_it_and_drops_nothing() {
    let server = stateplane_lab::RedisServer::start(free_port(), false).unwrap();
    let trace = tmp("rep-kv-backlog.pcap");
    generate(
        &trace,
        "kv --packets 100000 --flows 1000 --kv-get-share 0.95",
    );
    let config = |name: &str, extra: &str| {
        let path = tmp(&format!("{name}.toml"));
        std::fs::write(
            &path,
            format!(
                "[program]\nname = \"kv\"\n[program.kv]\nserver = \"{}\"\nclients = \"p0\"\n\
                 backend = \"p1\"\n[[port]]\nname = \"p0\"\nrx = \"{}\"\n[[port]]\nname = \"p1\"\n\
                 tx = \"{}\"\n{extra}",
                stateplane_gen::KV_SERVER,
                trace.display(),
                tmp(&format!("{name}.pcap")).display()
            ),
        )
        .unwrap();
        path
    };
    let plain = run_json(&config("rep-kv-plain", ""));
    let replicated = run_json(&config(
        "rep-kv-redis",
        &format!(
            "[guarantees]\ncache = [\"replicated\"]\n[replication]\nstore = \"{}\"\npark_limit = 1000\n",
            server.url()
        ),
    ));
    let r = &replicated["replication"];
    assert_eq!(r["dropped"], 0, "{r}");
    assert!(r["held_most"].as_u64().unwrap() <= 1000 + 128, "{r}");
    assert!(
        r["acquires"].as_u64().unwrap() > 1000,
        "keys wait for leases: {r}"
    );
    assert!(
        r["repeats_held"].as_u64().unwrap() <= r["retransmits"].as_u64().unwrap(),
        "requests held back are some of those sent again: {r}"
    );
    assert_eq!(
        replicated["counters"]["tx_packets"], plain["counters"]["tx_packets"],
        "{replicated}"
    );
}

/// Every record of a Redis store: each flow's packets and bytes (counter's state: its
/// action, then packets and bytes as 16 bytes each; a flow leased and never written: 0).
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
            if v.is_empty() {
                return (0, 0); // leased, never written
            }
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

/// Replicated to Redis over TLS, as an ACL user with a password: the switch trusts the
/// server through the CA it is given and shows the certificate that CA signed it (the
/// server asks for one), every count lands in the store, and the password is in no line
/// the run writes.
#[test]
fn counter_replicated_to_redis_over_tls_with_a_password_leaves_every_count_in_the_store() {
    let pki = stateplane_test_pki::TestPki::new("replication-tls").unwrap();
    let (server, url) = tls_server_with_user(&pki, "app", "app-secret-9");
    let ca = pki.path("ca.pem");
    let store = format!(
        "{REPLICATED}[replication]\nstore = \"{url}\"\ntls_ca = \"{}\"\n\
         tls_cert = \"{}\"\ntls_key = \"{}\"\n",
        ca.display(),
        pki.path("client.pem").display(),
        pki.path("client.key").display()
    );
    let (config, _) = counter_run("rep-redis-tls", 3_000, 100, &store);
    let out = bin()
        .args(["run", "--json", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stdout = ok_without(out, "app-secret-9");
    let summary: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let (packets_in, packets_out, dropped) = in_out_dropped(&summary);
    assert_eq!((packets_out, dropped), (packets_in, 0), "{summary}");
    assert_eq!(summary["replication"]["dropped"], 0, "{summary}");
    // Read through the server's plain port: what came over TLS is there.
    let counts = redis_counts(&server.url());
    assert_eq!(counts.iter().map(|c| c.0).sum::<u64>(), packets_in);
}

/// Replicated through Redis Sentinel (`redis+sentinel://`): the switch asks the sentinel
/// for the master and leaves every count there.
#[test]
fn counter_replicated_through_redis_sentinel_leaves_every_count_at_its_master() {
    let master = stateplane_lab::RedisServer::start(free_port(), false).unwrap();
    let sentinel =
        stateplane_lab::RedisServer::sentinel(free_port(), "rep", master.port()).unwrap();
    let store = format!(
        "{REPLICATED}[replication]\nstore = \"redis+sentinel://127.0.0.1:{}/rep\"\n",
        sentinel.port()
    );
    let (config, _) = counter_run("rep-redis-sentinel", 3_000, 100, &store);
    let summary = run_json(&config);
    let (packets_in, packets_out, dropped) = in_out_dropped(&summary);
    assert_eq!((packets_out, dropped), (packets_in, 0), "{summary}");
    let counts = redis_counts(&master.url());
    assert_eq!(counts.iter().map(|c| c.0).sum::<u64>(), packets_in);
    let store = format!(
        "{REPLICATED}[replication]\nstore = \"redis+sentinel://127.0.0.1:{}/nobody\"\n",
        sentinel.port()
    );
    let (config, _) = counter_run("rep-redis-sentinel-nobody", 10, 2, &store);
    run_refused(&config, "the sentinels name no master of that name");
}

/// Two workers, each holding outputs for Redis, finish an offline run with every packet
/// forwarded: a worker's held packets wait for its next round's burst, never put it a
/// round ahead of the other at the output (which would stall the run).
#[test]
fn two_workers_holding_outputs_for_redis_forward_every_packet_and_finish() {
    let server = stateplane_lab::RedisServer::start(free_port(), false).unwrap();
    let store = format!("{REPLICATED}[replication]\nstore = \"{}\"\n", server.url());
    let (config, out) = counter_run("rep-two", 50_000, 500, &store);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("workers = 2\n{text}")).unwrap();
    let mut run = spawn_run(&config);
    let start = std::time::Instant::now();
    while run.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = run.kill();
            panic!("the run did not finish within 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let output = run.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let c = &summary["counters"];
    assert_eq!(c["rx_packets"], 50_000, "{summary}");
    assert_eq!(c["tx_packets"], 50_000, "{summary}");
    assert!(
        summary["replication"]["held_most"].as_u64().unwrap() > 0,
        "{summary}"
    );
    // The capture holds every packet: 24 bytes of header, then each with 16 of its own.
    let written = std::fs::metadata(&out).unwrap().len();
    let trace = std::fs::metadata(tmp("rep-two.pcap")).unwrap().len();
    assert_eq!(
        written, trace,
        "the output holds the input's packets, all of them"
    );
}

/// `counter` over 600,000 packets of 2,000 flows replicated to `server` (leases and the
/// park timeout 300 ms), the store killed (SIGKILL) once the run is under way (its first
/// flows in the store): the run, and its output capture.
fn counter_run_losing_its_store(
    server: &mut stateplane_lab::RedisServer,
    name: &str,
) -> (std::process::Child, std::path::PathBuf) {
    let store = format!(
        "{REPLICATED}[replication]\nstore = \"{}\"\nlease_ms = 300\npark_timeout_ms = 300\n",
        server.url()
    );
    let (config, out) = counter_run(name, 600_000, 2_000, &store);
    let run = spawn_run(&config);
    kill_once_it_holds(server, 100);
    (run, out)
}

/// Kills `server` (SIGKILL) once it holds `records` records: a run's first writes.
fn kill_once_it_holds(server: &mut stateplane_lab::RedisServer, records: u64) {
    let start = std::time::Instant::now();
    while server.cli(&["dbsize"]).trim().parse::<u64>().unwrap_or(0) < records {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "no records"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    server.kill();
}

/// Starts `server` again 400 ms after it was killed (longer than any lease of these
/// tests), and waits for `run` to end: it succeeded and said it reached the store again.
/// Its JSON summary.
fn restart_and_finish(
    server: &mut stateplane_lab::RedisServer,
    run: std::process::Child,
) -> serde_json::Value {
    std::thread::sleep(std::time::Duration::from_millis(400));
    server.restart().unwrap();
    let output = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("connected again"), "{stderr}");
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The store killed in the middle of a run (SIGKILL) and started again from its append-only
/// file: the switch goes on, holds what waits for it, drops (and counts) what waited past
/// `park_timeout_ms`, connects again and finishes; no packet is unaccounted for, and every
/// packet that left is counted in the store.
#[test]
fn a_store_lost_mid_run_and_back_is_survived_and_every_packet_accounted_for() {
    let mut server = stateplane_lab::RedisServer::start(free_port(), true).unwrap();
    let (run, out) = counter_run_losing_its_store(&mut server, "rep-lost");
    let summary = restart_and_finish(&mut server, run);
    let (rx, tx, dropped) = in_out_dropped(&summary);
    let r = &summary["replication"];
    assert_eq!(rx, 600_000, "{summary}");
    assert_eq!(rx, tx + dropped, "every packet out or dropped: {summary}");
    assert_eq!(r["dropped"].as_u64(), Some(dropped), "{r}");
    assert!(
        dropped > 0,
        "packets waited past the timeout while it was gone: {r}"
    );
    assert!(r["reconnects"].as_u64().unwrap() >= 1, "{r}");
    assert!(r["store_errors"].as_u64().unwrap() >= 1, "{r}");
    // The output capture holds exactly the packets that left.
    let written = std::fs::metadata(&out).unwrap().len();
    assert!(written > 24, "{written}");
    // Every packet that left had its count acknowledged, so kept (appendfsync always).
    let counted: u64 = redis_counts(&server.url()).iter().map(|c| c.0).sum();
    assert!(
        (tx..=rx).contains(&counted),
        "the store counts {counted}; {tx} left, {rx} came"
    );
}

/// `firewall` over passes of established flows (`gen --established-passes 8`: 500
/// connections opened in the first pass, none closed), its connections replicated with a
/// 300 ms lease to a store killed (SIGKILL) while the first pass's writes are on their way
/// and started again from its append-only file 400 ms on, past every lease: the writes
/// the store then refuses as of a passed lease go under the leases taken again (nobody
/// else wrote), the leases that ran out are taken again with their connections' state,
/// and every packet is forwarded: none held past `park_timeout_ms` (2 s), none dropped by
/// the firewall as of a connection it lost.
#[test]
fn a_store_lost_for_longer_than_the_lease_loses_no_connection_and_no_packet() {
    let trace = tmp("rep-lost-fw.pcap");
    generate(
        &trace,
        "datacenter --packets 30000 --flows 500 --established-passes 8",
    );
    let mut server = stateplane_lab::RedisServer::start(free_port(), true).unwrap();
    let config = tmp("rep-lost-fw.toml");
    std::fs::write(
        &config,
        format!(
            "[program]\nname = \"firewall\"\n[program.firewall]\ninside = \"p0\"\n\
             [guarantees]\nconnections = [\"replicated\"]\n\
             [replication]\nstore = \"{}\"\nlease_ms = 300\npark_timeout_ms = 2000\n\
             [[port]]\nname = \"p0\"\nrx = \"{}\"\n[[port]]\nname = \"p1\"\ntx = \"{}\"\n",
            server.url(),
            trace.display(),
            tmp("rep-lost-fw-out.pcap").display()
        ),
    )
    .unwrap();
    let run = spawn_run(&config);
    kill_once_it_holds(&mut server, 200);
    let summary = restart_and_finish(&mut server, run);
    let (rx, tx, dropped) = in_out_dropped(&summary);
    let r = &summary["replication"];
    assert_eq!(rx, 231_464, "the trace: {summary}");
    assert_eq!((tx, dropped), (rx, 0), "every packet forwarded: {summary}");
    assert!(r["reconnects"].as_u64().unwrap() >= 1, "{r}");
    // Writes were refused as of a passed lease, and went under the lease taken again.
    let (fenced, retaken) = (
        r["fenced"].as_u64().unwrap(),
        r["retaken"].as_u64().unwrap(),
    );
    assert!(fenced >= 1 && retaken >= 1, "{r}");
}

/// The store killed in the middle of a run over a capture and never back: once it has
/// been out of reach for `park_timeout_ms`, the run stops waiting for it (a capture is
/// read as fast as the store answers while it answers), so the rest of the capture goes
/// through at once, its replicated flows' packets dropped and counted, and the run ends.
#[test]
fn a_store_lost_for_good_mid_run_ends_the_run_with_every_packet_accounted_for() {
    use std::time::Duration;
    let mut server = stateplane_lab::RedisServer::start(free_port(), false).unwrap();
    let (mut run, _) = counter_run_losing_its_store(&mut server, "rep-lost-for-good");
    let lost = std::time::Instant::now();
    // Waiting 300 ms for each half park (2,048 packets) would take the rest of the
    // capture a minute and more.
    while run.try_wait().unwrap().is_none() {
        if lost.elapsed() > Duration::from_secs(20) {
            run.kill().unwrap();
            panic!("the run still waits for a store gone for good");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("replicated flows wait"), "{stderr}");
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let (rx, tx, dropped) = in_out_dropped(&summary);
    assert_eq!(rx, 600_000, "{summary}");
    assert_eq!(rx, tx + dropped, "every packet out or dropped: {summary}");
    assert_eq!(summary["replication"]["dropped"].as_u64(), Some(dropped));
    assert!(dropped > 100_000, "the rest dropped, counted: {summary}");
}

/// A run of `config` fails, saying `message`.
fn run_refused(config: &std::path::Path, message: &str) {
    let out = bin()
        .args(["run", "--config"])
        .arg(config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(message),
        "{message}: {err}"
    );
}

/// What replication cannot keep yet, or is given wrong, is refused by name with the fix.
#[test]
fn replication_settings_that_nothing_keeps_are_refused() {
    let cases = [
        (
            format!("{REPLICATED}[replication]\nmode = \"bounded\"\n"),
            "`flows` cannot be replicated in bounded mode: its snapshots are not built",
        ),
        (
            format!("{REPLICATED}[replication]\nsnapshot_ms = 10\n"),
            "replication.snapshot_ms: it sets bounded mode's snapshots, and the mode is \
             linearizable",
        ),
        (
            format!("{REPLICATED}[replication]\non_stale = \"drop\"\n"),
            "replication.on_stale: it sets bounded mode's snapshots",
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
            format!("{REPLICATED}[replication]\ncluster = true\n"),
            "the memory store is no cluster",
        ),
        (
            format!("{REPLICATED}[replication]\nwait_ms = 50\n"),
            "leave wait_replicas and wait_ms out",
        ),
        (
            format!("{REPLICATED}[replication]\ntls_ca = \"/etc/hostname\"\n"),
            "replication.tls_ca: the memory store is in this process, with no connection to guard",
        ),
        (
            format!(
                "{REPLICATED}[replication]\nstore = \"redis://127.0.0.1:1/\"\ntls_ca = \"/etc/hostname\"\n"
            ),
            "replication.tls_ca: replication.store 'redis://127.0.0.1:1/' does not use TLS",
        ),
        (
            format!(
                "{REPLICATED}[replication]\nstore = \"rediss://127.0.0.1:1/\"\ntls_key = \"/etc/hostname\"\n"
            ),
            "replication.tls_key: a client key needs its certificate",
        ),
        (
            format!("{REPLICATED}[replication]\nstore = \"redis://127.0.0.1:1/\"\nwait_ms = 50\n"),
            "replication.wait_ms: it bounds the wait for `wait_replicas`",
        ),
        (
            format!(
                "{REPLICATED}[replication]\nstore = \"redis://127.0.0.1:1/\"\nwait_replicas = 0\n"
            ),
            "replication.wait_replicas: 0 is outside 1 to 64",
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
        run_refused(&config, message);
    }
}

/// Bounded mode's settings out of range or meaningless are refused by name, before the
/// run: a period of 0, a bound below the period, an action that is none, a history
/// (bounded mode has none), a state both synced and snapshotted.
#[test]
fn bounded_settings_that_nothing_keeps_are_refused() {
    let (trace_config, _) = counter_run("bounded-refused", 10, 2, "");
    let trace = std::fs::read_to_string(&trace_config).unwrap();
    let rx = (trace.lines()).find(|l| l.starts_with("rx = ")).unwrap();
    let hh = format!(
        "[program]\nname = \"hh\"\n[program.hh]\nmap = {{ p0 = \"p1\" }}\n\
         [[port]]\nname = \"p0\"\n{rx}\n[[port]]\nname = \"p1\"\n"
    );
    let bounded = "[guarantees]\nsketch = [\"replicated\"]\n[replication]\nmode = \"bounded\"\n";
    let cases = [
        (
            format!("{bounded}snapshot_ms = 0\n"),
            "replication.snapshot_ms: 0 is outside 1 to 60000",
        ),
        (
            format!("{bounded}snapshot_ms = 10\nstaleness_ms = 5\n"),
            "replication.staleness_ms: 5 is below snapshot_ms (10)",
        ),
        (
            format!("{bounded}on_stale = \"panic\"\n"),
            "replication.on_stale: 'panic' is not an action",
        ),
        (
            format!("{bounded}history = \"h.jsonl\"\n"),
            "replication.history: histories record the packets of flows replicated in \
             linearizable mode",
        ),
        (
            "[guarantees]\nsketch = [\"replicated\", \"synced\"]\n[replication]\n\
             mode = \"bounded\"\n"
                .to_string(),
            "`sketch` cannot be both synced and replicated in bounded mode",
        ),
    ];
    for (i, (extra, message)) in cases.iter().enumerate() {
        let config = tmp(&format!("bounded-refused-{i}.toml"));
        std::fs::write(&config, format!("{hh}{extra}")).unwrap();
        run_refused(&config, message);
    }
}

/// counter's flow as a history records it: the packets and bytes after a packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Counts(u64, u64);

/// What a history shows of a packet's output: the flow's counts after it, or nothing (a
/// flow's earlier packets in a burst: only the burst's last state is kept). Nothing
/// agrees with any counts.
#[derive(Clone, Copy, Debug)]
struct Shown(Option<Counts>);

impl PartialEq for Shown {
    fn eq(&self, other: &Shown) -> bool {
        match (self.0, other.0) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        }
    }
}

/// counter, per flow: a packet of `len` bytes counts one packet and its bytes.
struct CounterModel;

impl stateplane_replication::history::Model for CounterModel {
    type State = Counts;
    type Input = u64;
    type Output = Shown;
    fn init(&self) -> Counts {
        Counts::default()
    }
    fn step(&self, s: &Counts, len: &u64) -> (Counts, Shown) {
        let next = Counts(s.0 + 1, s.1 + len);
        (next, Shown(Some(next)))
    }
    fn reveals(&self, output: &Shown) -> bool {
        output.0.is_some()
    }
}

/// The state a history line shows: counter's entry (its action, then packets and bytes,
/// 16 bytes each, in hex); "" for none; null for not kept.
fn shown(state: &serde_json::Value) -> Shown {
    let Some(hex) = state.as_str() else {
        return Shown(None);
    };
    if hex.is_empty() {
        return Shown(Some(Counts::default()));
    }
    let bytes = hex_bytes(hex);
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    Shown(Some(Counts(word(1), word(17))))
}

/// The histories in `files`, as operations per flow. A process killed mid-line leaves a
/// last line cut short: it is left out (its packets' calls were on record before).
fn operations(
    files: &[std::path::PathBuf],
) -> std::collections::BTreeMap<String, Vec<stateplane_replication::history::Operation<u64, Shown>>>
{
    use std::collections::{BTreeMap, HashMap};
    let mut calls: HashMap<String, (String, u64, u64)> = HashMap::new();
    let mut returns: HashMap<String, (u64, Shown)> = HashMap::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                assert_eq!(
                    n + 1,
                    lines.len(),
                    "{}: line {} is not JSON",
                    file.display(),
                    n + 1
                );
                continue;
            };
            let op = v["op"].as_str().unwrap().to_string();
            if let Some(call) = v["call_ns"].as_u64() {
                let flow = v["flow"].as_str().unwrap().to_string();
                calls.insert(op, (flow, v["len"].as_u64().unwrap(), call));
            } else if let Some(ret) = v["return_ns"].as_u64() {
                returns.insert(op, (ret, shown(&v["state"])));
            }
        }
    }
    let mut by_flow: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for (op, (flow, len, call)) in calls {
        by_flow
            .entry(flow)
            .or_default()
            .push(stateplane_replication::history::Operation {
                input: len,
                call,
                ret: returns.remove(&op),
            });
    }
    assert!(returns.is_empty(), "returns with no call: {returns:?}");
    by_flow
}

/// Two switch processes on one Redis, as a failover: the first is killed (SIGKILL) in the
/// middle of its run; the second then takes every packet again, each flow once the first's
/// lease has passed. Both histories (`--history`) together are linearizable per flow: no
/// count the first acknowledged is lost, none is counted twice, and the second goes on
/// from what the store has.
#[test]
fn two_switches_one_killed_mid_run_keep_every_flow_linearizable() {
    let server = stateplane_lab::RedisServer::start(free_port(), false).unwrap();
    let store = format!(
        "{REPLICATED}[replication]\nstore = \"{}\"\nlease_ms = 200\n",
        server.url()
    );
    let (config, _) = counter_run("rep-kill", 30_000, 64, &store);
    let (first, second) = (tmp("rep-kill-a.jsonl"), tmp("rep-kill-b.jsonl"));
    // Killed a fifth and three fifths of the way through its packets (by its history's
    // lines, so on a machine of any speed), each a different moment of its bursts.
    for kill_at in [0.2, 0.6] {
        server.cli(&["flushall"]);
        let _ = std::fs::remove_file(&first);
        let _ = std::fs::remove_file(&second);
        let mut a = bin()
            .args(["run", "--config"])
            .arg(&config)
            .arg("--history")
            .arg(&first)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // A packet's call and return are two lines.
        let lines = (2.0 * 30_000.0 * kill_at) as usize;
        let start = std::time::Instant::now();
        while std::fs::read_to_string(&first).map_or(0, |t| t.lines().count()) < lines {
            assert!(
                a.try_wait().unwrap().is_none(),
                "the first switch ended before {lines} lines of history"
            );
            assert!(
                start.elapsed() < std::time::Duration::from_secs(30),
                "the first switch wrote fewer than {lines} lines of history in 30 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        a.kill().unwrap(); // SIGKILL
        a.wait().unwrap();
        let b: serde_json::Value = serde_json::from_str(&ok(bin()
            .args(["run", "--json", "--config"])
            .arg(&config)
            .arg("--history")
            .arg(&second)
            .output()
            .unwrap()))
        .unwrap();
        let r = &b["replication"];
        assert!(
            r["migrated"].as_u64().unwrap() > 0 && r["waited"].as_u64().unwrap() > 0,
            "the second switch waited for the first's leases and took its flows' counts: {r}"
        );
        let flows = operations(&[first.clone(), second.clone()]);
        assert!(flows.len() > 50, "{} flows", flows.len());
        let (mut ops, mut open) = (0, 0);
        for (flow, history) in &flows {
            ops += history.len();
            open += history.iter().filter(|o| o.ret.is_none()).count();
            let verdict =
                stateplane_replication::history::check(&CounterModel, history, 50_000_000);
            assert_eq!(
                verdict,
                stateplane_replication::history::Verdict::Linearizable,
                "killed at {kill_at} of its packets, flow {flow}"
            );
        }
        assert!(
            ops > 30_000,
            "the second switch's packets and some of the first's: {ops}: {r}"
        );
        eprintln!(
            "killed at {kill_at} of its packets: {ops} packets checked, {open} without output"
        );
        // The same histories through Porcupine, a checker of no part of this project
        // (docs/REPLICATION.md, *Histories*), and again with one packet's count shown one
        // short (an acknowledged count lost), which it must refuse.
        let said = porcupine(&[first.clone(), second.clone()], true);
        assert!(
            said.contains(&format!(
                "{} flows, {ops} packets ({open} without output): linearizable",
                flows.len()
            )),
            "{said}"
        );
        let lost = tmp("rep-kill-lost.jsonl");
        std::fs::write(&lost, with_a_count_lost(&first, &second)).unwrap();
        let said = porcupine(&[first.clone(), lost], false);
        assert!(said.contains(": NOT linearizable"), "{said}");
    }
}

/// Porcupine's verdict on `histories` (scripts/porcupine, built here with Go), which must
/// be `linearizable` or not as `expected` says; what it printed.
fn porcupine(histories: &[std::path::PathBuf], expected: bool) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/porcupine");
    let checker = tmp("porcupine");
    if !checker.exists() {
        ok(common::tool("go")
            .args(["build", "-buildvcs=false", "-o"])
            .arg(&checker)
            .arg(".")
            .current_dir(dir)
            .output()
            .unwrap());
    }
    let out = std::process::Command::new(&checker)
        .args(histories)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.success(), expected, "{said}");
    said
}

/// `second` with one return showing a count one packet short: that of a flow with no
/// packet left without output in either history (such a packet may or may not have
/// counted, which could explain a count short of one), so that two packets show the same
/// count, which no order gives.
fn with_a_count_lost(first: &std::path::Path, second: &std::path::Path) -> String {
    let read = |path: &std::path::Path| -> Vec<serde_json::Value> {
        (std::fs::read_to_string(path).unwrap().lines())
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let (mut lines, before) = (read(second), read(first));
    let mut flow_of = std::collections::HashMap::new();
    let mut returned = std::collections::HashSet::new();
    for line in before.iter().chain(&lines) {
        let op = line["op"].to_string();
        if line["call_ns"].is_u64() {
            flow_of.insert(op, line["flow"].to_string());
        } else if line["return_ns"].is_u64() {
            returned.insert(op);
        }
    }
    let open: std::collections::HashSet<_> = (flow_of.iter())
        .filter(|(op, _)| !returned.contains(*op))
        .map(|(_, flow)| flow.clone())
        .collect();
    let line = (lines.iter_mut())
        .find(|l| {
            l["state"].as_str().is_some_and(|s| s.len() >= 66)
                && !open.contains(&flow_of[&l["op"].to_string()])
        })
        .unwrap_or_else(|| panic!("no return shows a state of a flow with every output known"));
    let mut bytes = hex_bytes(line["state"].as_str().unwrap());
    let packets = u64::from_le_bytes(bytes[1..9].try_into().unwrap());
    bytes[1..9].copy_from_slice(&(packets - 1).to_le_bytes());
    line["state"] = bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
        .into();
    lines.iter().map(|l| format!("{l}\n")).collect()
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// `bench-replication` runs each program unreplicated and replicated to both stores, over
/// its trace once and as passes of established flows, checks the counts and the outputs,
/// and writes its CSV: counter writes at every packet,
/// the firewall, nat, lb, sgw and kv far less (their reads write nothing); bad flags are
/// refused by name.
#[test]
fn bench_replication_runs_each_program_three_ways_and_checks_the_counts() {
    let csv = tmp("replication.csv");
    ok(bin()
        .args(["bench-replication", "--packets", "3000", "--flows", "50"])
        .args(["--bursts", "32", "--repeat", "1", "--csv"])
        .arg(&csv)
        .output()
        .unwrap());
    let text = std::fs::read_to_string(&csv).unwrap();
    let writes = |program: &str, mode: &str| -> u64 {
        let row = (text.lines())
            .find(|l| l.starts_with(&format!("{program},{mode},32,")))
            .unwrap_or_else(|| panic!("no {program} {mode} row in {text}"));
        row.split(',').nth(8).unwrap().parse().unwrap()
    };
    for program in [
        "counter",
        "firewall",
        "nat",
        "lb",
        "sgw",
        "kv 5% PUT",
        "kv 50% PUT",
    ] {
        assert_eq!(writes(program, "unreplicated"), 0, "{text}");
        for mode in ["memory", "redis"] {
            let w = writes(program, mode);
            assert!(w > 0, "{program} {mode}: {text}");
            if program != "counter" {
                assert!(w < 3000 / 2, "{program} {mode} mostly reads: {text}");
            }
        }
    }
    assert!(
        writes("kv 5% PUT", "memory") < writes("kv 50% PUT", "memory"),
        "{text}"
    );
    // Each Redis row says what share of a core the server took over the run; no other
    // row has a store beside the switch to say it of.
    assert!(
        text.lines().next().unwrap().ends_with(",store_cpu"),
        "{text}"
    );
    for row in text.lines().skip(1) {
        let cpu = row.rsplit(',').next().unwrap();
        if row.split(',').nth(1) == Some("redis") {
            let share: f64 = cpu.parse().unwrap();
            assert!(share > 0.0 && share < 4.0, "{row}");
        } else {
            assert_eq!(cpu, "", "{row}");
        }
    }
    // Each row's rate on established flows (its later passes) is a rate, or left
    // empty where the two runs' times were too close to tell it; the unreplicated row's
    // ratio is 1 wherever it is told.
    assert!(
        (text.lines().next().unwrap())
            .contains(",vs_unreplicated,established_packets_per_s,established_vs_unreplicated,"),
        "{text}"
    );
    for row in text.lines().skip(1) {
        let field = |i: usize| row.split(',').nth(i).unwrap();
        let (established, ratio) = (field(5), field(6));
        if established.is_empty() {
            assert_eq!(ratio, "", "{row}");
            continue;
        }
        assert!(established.parse::<f64>().unwrap() > 0.0, "{row}");
        if field(1) == "unreplicated" {
            assert_eq!(ratio, "1.0000", "{row}");
        }
    }
    refused(
        &["bench-replication", "--bursts", "0"],
        "--bursts: '0' is not a burst size from 1 to 1024",
    );
    // `--programs` measures those alone, and refuses a name it does not know.
    ok(bin()
        .args(["bench-replication", "--packets", "3000", "--flows", "50"])
        .args([
            "--bursts",
            "32",
            "--repeat",
            "1",
            "--programs",
            "lb,kv",
            "--csv",
        ])
        .arg(&csv)
        .output()
        .unwrap());
    let text = std::fs::read_to_string(&csv).unwrap();
    let programs: std::collections::BTreeSet<&str> = (text.lines().skip(1))
        .map(|row| row.split(',').next().unwrap())
        .collect();
    assert_eq!(
        programs.into_iter().collect::<Vec<_>>(),
        ["kv 5% PUT", "kv 50% PUT", "lb"],
        "{text}"
    );
    refused(
        &["bench-replication", "--programs", "firewall,foo"],
        "--programs: 'foo' is not one of counter, firewall, nat, lb, sgw, kv",
    );
}

/// A switch killed (SIGKILL) at a random moment of a run in bounded mode leaves in Redis a
/// whole snapshot (each sketch's rows sum to one count: a torn image would not), and the
/// switch started again as the same switch counts on from exactly it.
#[test]
fn a_switch_killed_in_bounded_mode_leaves_a_whole_snapshot_to_count_on_from() {
    use stateplane_bench::bench_snapshots::{stored_packets, stored_sketch_rows};
    let server = stateplane_lab::RedisServer::start(free_port(), false).unwrap();
    let trace = tmp("bounded-kill.pcap");
    generate(&trace, "internet --packets 1000000 --flows 2000 --vlans 4");
    let config = tmp("bounded-kill.toml");
    std::fs::write(
        &config,
        format!(
            "[program]\nname = \"hh\"\n[program.hh]\ninterval_ms = 3600000\n\
             map = {{ p0 = \"p1\" }}\n[[port]]\nname = \"p0\"\nrx = \"{}\"\n\
             [[port]]\nname = \"p1\"\n[guarantees]\nsketch = [\"replicated\"]\n\
             [replication]\nmode = \"bounded\"\nstore = \"{}\"\nsnapshot_ms = 2\n\
             lease_ms = 200\n",
            trace.display(),
            server.url()
        ),
    )
    .unwrap();
    // Killed once a few snapshots are in the store, before the run would end.
    let mut run = spawn_run(&config);
    let started = std::time::Instant::now();
    let killed_at = loop {
        let stored = stored_sketch_rows(&server.url()).unwrap();
        let counted = stored_packets(&stored, 1).unwrap();
        if counted > 0 || started.elapsed() > std::time::Duration::from_secs(20) {
            break counted;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    std::thread::sleep(std::time::Duration::from_millis(15));
    run.kill().unwrap(); // SIGKILL
    run.wait().unwrap();
    assert!(
        killed_at > 0,
        "a snapshot reached the store before the kill"
    );
    // Whole: every sketch's rows agree (checked by stored_packets), and not the end.
    let left = stored_packets(&stored_sketch_rows(&server.url()).unwrap(), 1).unwrap();
    assert!(
        left >= killed_at && left < 1_000_000,
        "{left} packets in the snapshot"
    );
    let second = run_json(&config);
    let r = &second["replication"];
    assert_eq!(r["installed"], 1, "{r}");
    let last = stored_packets(&stored_sketch_rows(&server.url()).unwrap(), 1).unwrap();
    assert_eq!(
        last,
        left + 1_000_000,
        "counted on from exactly the snapshot left"
    );
}

/// `bench-snapshots` runs hh unreplicated and in bounded mode on both stores at each
/// period (it checks every Redis run's last images itself), with its CSV and chart; bad
/// flags are refused by name.
#[test]
fn bench_snapshots_runs_hh_by_period_on_both_stores() {
    let csv = tmp("snapshots.csv");
    let svg = tmp("snapshots.svg");
    ok(bin()
        .args(["bench-snapshots", "--packets", "20000", "--flows", "300"])
        .args(["--periods", "2,50", "--repeat", "1", "--csv"])
        .arg(&csv)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap());
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 5, "{text}");
    assert_eq!(rows[0][0], "unreplicated");
    for row in &rows[1..] {
        let snapshots: u64 = row[4].parse().unwrap();
        let bytes: f64 = row[5].parse().unwrap();
        assert!(snapshots >= 1 && bytes > 0.0, "{row:?}");
    }
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    refused(
        &["bench-snapshots", "--periods", "0"],
        "--periods: '0' is not a period from 1 to 60000 ms",
    );
}

/// Writes `connections` TCP connections' packets from one side as a capture: from the
/// inside (198.18.0.1, port 10000 + i, to 198.19.0.1:80), each connection's SYN; from the
/// outside, each one's SYN-ACK then `more` ACKs carrying data.
fn write_one_side(path: &std::path::Path, connections: u16, inside: bool, more: u16) {
    use stateplane_gen::build::{L4, emit_frame};
    let (client, server) = common::client_and_server();
    let mut w =
        stateplane_io::pcap::PcapWriter::new(std::fs::File::create(path).unwrap(), true).unwrap();
    let mut ts = 1_000_000_000;
    for round in 0..=more {
        for c in 0..connections {
            let port = 10_000 + c;
            let (hosts, l4) = if inside {
                let syn = L4::Tcp {
                    src_port: port,
                    dst_port: 80,
                    seq: 0,
                    ack: 0,
                    flags: 0x02,
                };
                (&client, syn)
            } else {
                let flags = if round == 0 { 0x12 } else { 0x10 };
                let answer = L4::Tcp {
                    src_port: 80,
                    dst_port: port,
                    seq: u32::from(round) * 100,
                    ack: 1,
                    flags,
                };
                (&server, answer)
            };
            let mut frame = Vec::new();
            emit_frame(&mut frame, hosts, &l4, &[0; 100]);
            w.write(ts, &frame, frame.len() as u32).unwrap();
            ts += 10_000;
        }
        if inside {
            break;
        }
    }
}

/// A `firewall` run on one side's capture (`inside`: SYNs in at port `in`; else answers
/// in at `out`), its connections replicated to `store` (none: unreplicated), with the
/// program's `settings` (TOML after `[program]`).
fn firewall_run(
    name: &str,
    capture: &std::path::Path,
    inside: bool,
    store: Option<&str>,
    settings: &str,
) -> serde_json::Value {
    one_side_run(
        ("firewall", "connections"),
        name,
        capture,
        inside,
        store,
        settings,
    )
}

/// A run of `program` on one side's capture (as [`firewall_run`]), its state `state`
/// replicated to `store`; its output at port `out` (from the inside) or `in` in
/// `tmp("{name}-{port}.pcap")`.
fn one_side_run(
    (program, state): (&str, &str),
    name: &str,
    capture: &std::path::Path,
    inside: bool,
    store: Option<&str>,
    settings: &str,
) -> serde_json::Value {
    let config = tmp(&format!("{name}.toml"));
    let (rx_port, tx_port) = if inside { ("in", "out") } else { ("out", "in") };
    let replicated = store.map_or(String::new(), |url| {
        format!("[guarantees]\n{state} = [\"replicated\"]\n[replication]\nstore = \"{url}\"\nlease_ms = 200\n")
    });
    let mut ports = String::new();
    for port in ["in", "out"] {
        ports += &format!("[[port]]\nname = \"{port}\"\n");
        if port == rx_port {
            ports += &format!("rx = \"{}\"\n", capture.display());
        }
        if port == tx_port {
            ports += &format!(
                "tx = \"{}\"\n",
                tmp(&format!("{name}-{port}.pcap")).display()
            );
        }
    }
    std::fs::write(
        &config,
        format!("[program]\nname = \"{program}\"\n{settings}{replicated}{ports}"),
    )
    .unwrap();
    run_json(&config)
}

/// The frames of a capture, parsed.
fn parsed_frames(path: &std::path::Path) -> Vec<(Vec<u8>, stateplane_wire::parse::Parsed)> {
    let file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let mut r = stateplane_io::pcap::PcapReader::new(file).unwrap();
    let hasher = stateplane_wire::FlowHasher::with_seed(1);
    let mut frames = Vec::new();
    while let Some(record) = r.next_record().unwrap() {
        let parsed = stateplane_wire::parse::parse(record.data, 0, &hasher).unwrap();
        frames.push((record.data.to_vec(), parsed));
    }
    frames
}

/// `nat` with its translations replicated to a real Redis. Switch A translates 300
/// connections' SYNs from the inside, each to a port of its own pool; switch B, another
/// process with another pool, sees only the answers, addressed to those ports (made from
/// A's output): it knows no translation, so it finds each connection by its answer
/// (the alias A wrote with it), takes it over from the store and lets every answer in,
/// restored to the inside host. Switch C then sees the inside's next packets and sends
/// them out on the ports A chose, not its own. Unreplicated, B drops every answer.
#[test]
fn nat_translations_replicated_to_redis_let_answers_in_at_another_switch() {
    use std::collections::BTreeSet;
    const CONNECTIONS: u16 = 300;
    const MORE: u16 = 4;
    let server = stateplane_lab::RedisServer::start(free_port(), false).unwrap();
    let url = server.url();
    let external: std::net::Ipv4Addr = "198.18.9.1".parse().unwrap();
    let nat =
        |pool: &str| format!("[program.nat]\nexternal = \"{external}\"\nports = \"{pool}\"\n");
    let syns = tmp("nat-rep-syns.pcap");
    write_one_side(&syns, CONNECTIONS, true, 0);
    let a = one_side_run(
        ("nat", "translations"),
        "nat-rep-a",
        &syns,
        true,
        Some(&url),
        &nat("20000-29999"),
    );
    assert_eq!(a["counters"]["tx_packets"], u64::from(CONNECTIONS), "{a}");
    let a_out = parsed_frames(&tmp("nat-rep-a-out.pcap"));
    let ports: BTreeSet<u16> = a_out.iter().map(|(_, p)| p.key.src_port).collect();
    assert_eq!(ports.len(), usize::from(CONNECTIONS));
    assert!(
        ports.iter().all(|p| (20_000..30_000).contains(p)),
        "{ports:?}"
    );

    // The answers: to the external address and the ports A chose, a SYN-ACK, then more.
    let answers = tmp("nat-rep-answers.pcap");
    {
        use stateplane_gen::build::{Hosts, L4, emit_frame};
        let (_, server_side) = common::client_and_server();
        let to_external = Hosts {
            dst: external.into(),
            ..server_side
        };
        let file = std::fs::File::create(&answers).unwrap();
        let mut w = stateplane_io::pcap::PcapWriter::new(file, true).unwrap();
        let mut ts = 1_000_000_000;
        for round in 0..=MORE {
            for &port in &ports {
                let flags = if round == 0 { 0x12 } else { 0x10 };
                let l4 = L4::Tcp {
                    src_port: 80,
                    dst_port: port,
                    seq: u32::from(round) * 100,
                    ack: 1,
                    flags,
                };
                let mut frame = Vec::new();
                emit_frame(&mut frame, &to_external, &l4, &[0; 100]);
                w.write(ts, &frame, frame.len() as u32).unwrap();
                ts += 10_000;
            }
        }
    }
    let answers_in = u64::from(CONNECTIONS) * u64::from(MORE + 1);
    let b = one_side_run(
        ("nat", "translations"),
        "nat-rep-b",
        &answers,
        false,
        Some(&url),
        &nat("30000-39999"),
    );
    let r = &b["replication"];
    assert_eq!(b["counters"]["tx_packets"], answers_in, "{b}");
    assert_eq!(
        r["resolved"],
        u64::from(CONNECTIONS),
        "one ask an answer's alias: {r}"
    );
    assert_eq!(r["migrated"], u64::from(CONNECTIONS), "{r}");
    assert_eq!(
        r["writes"],
        u64::from(CONNECTIONS),
        "established: one write each: {r}"
    );
    assert_eq!(r["dropped"], 0, "{r}");
    let inside_host = match common::client_and_server().0.src {
        std::net::IpAddr::V4(a) => a.octets(),
        std::net::IpAddr::V6(_) => unreachable!("the test's hosts are IPv4"),
    };
    let restored = parsed_frames(&tmp("nat-rep-b-in.pcap"));
    let inside_ports: BTreeSet<u16> = restored.iter().map(|(_, p)| p.key.dst_port).collect();
    assert!(
        (restored.iter()).all(|(_, p)| p.key.dst[..4] == inside_host[..]),
        "every answer goes to the inside host"
    );
    assert_eq!(inside_ports, (10_000..10_000 + CONNECTIONS).collect());

    // The inside's packets again, at a third switch: out on A's ports.
    let acks = tmp("nat-rep-acks.pcap");
    write_one_side(&acks, CONNECTIONS, true, 0);
    let c = one_side_run(
        ("nat", "translations"),
        "nat-rep-c",
        &acks,
        true,
        Some(&url),
        &nat("40000-49999"),
    );
    assert_eq!(c["counters"]["tx_packets"], u64::from(CONNECTIONS), "{c}");
    assert_eq!(c["replication"]["migrated"], u64::from(CONNECTIONS), "{c}");
    let c_ports: BTreeSet<u16> = (parsed_frames(&tmp("nat-rep-c-out.pcap")).iter())
        .map(|(_, p)| p.key.src_port)
        .collect();
    assert_eq!(c_ports, ports, "the ports A chose");

    let unreplicated = one_side_run(
        ("nat", "translations"),
        "nat-rep-d",
        &answers,
        false,
        None,
        &nat("30000-39999"),
    );
    assert_eq!(unreplicated["counters"]["tx_packets"], 0, "{unreplicated}");
    assert_eq!(
        unreplicated["drops"]["no_translation"], answers_in,
        "{unreplicated}"
    );
}

/// `firewall` with its connections replicated to a real Redis: the switch that opened
/// connections from the inside goes away and another takes their answers from the
/// outside; it takes each connection over from the store (after the first one's lease)
/// and lets its answers in, writing to the store only when a connection's state moves
/// (the answers after the SYN-ACK only read it; their packet counts stay local).
/// Unreplicated, the second switch knows no
/// connection and drops every answer as unsolicited.
#[test]
fn firewall_connections_replicated_to_redis_let_answers_in_at_another_switch() {
    const CONNECTIONS: u16 = 300;
    const MORE: u16 = 4;
    let server = stateplane_lab::RedisServer::start(free_port(), false).unwrap();
    let (syns, answers) = (tmp("fw-rep-syns.pcap"), tmp("fw-rep-answers.pcap"));
    write_one_side(&syns, CONNECTIONS, true, 0);
    write_one_side(&answers, CONNECTIONS, false, MORE);
    let answers_in = u64::from(CONNECTIONS) * u64::from(MORE + 1);

    let opened = firewall_run("fw-rep-a", &syns, true, Some(&server.url()), "");
    assert_eq!(
        opened["counters"]["tx_packets"],
        u64::from(CONNECTIONS),
        "{opened}"
    );
    assert_eq!(
        opened["replication"]["waited_for_store"],
        u64::from(CONNECTIONS),
        "each SYN opens a connection: a write"
    );

    let taken_over = firewall_run("fw-rep-b", &answers, false, Some(&server.url()), "");
    let r = &taken_over["replication"];
    assert_eq!(
        taken_over["counters"]["tx_packets"], answers_in,
        "{taken_over}"
    );
    assert_eq!(r["migrated"], u64::from(CONNECTIONS), "{r}");
    assert_eq!(r["processed"], answers_in, "{r}");
    assert_eq!(
        r["writes"],
        u64::from(CONNECTIONS),
        "one write a connection (its SYN-ACK's), none for the answers after it: {r}"
    );
    assert_eq!(r["dropped"], 0, "{r}");

    let unreplicated = firewall_run("fw-rep-c", &answers, false, None, "");
    assert_eq!(unreplicated["counters"]["tx_packets"], 0, "{unreplicated}");
    let drops = unreplicated.to_string();
    assert!(drops.contains("unsolicited"), "{drops}");
}

/// A switch whose table is full refuses the states the store grants it beyond its room,
/// counts them (`install_refused`), and treats those flows' packets as it would with no
/// state (the answers dropped as unsolicited); the store keeps every state, and a switch
/// with room takes them all afterwards.
#[test]
fn states_a_full_table_cannot_take_are_refused_counted_and_kept_at_the_store() {
    const CONNECTIONS: u16 = 200;
    let server = stateplane_lab::RedisServer::start(free_port(), false).unwrap();
    let (syns, answers) = (tmp("fw-full-syns.pcap"), tmp("fw-full-answers.pcap"));
    write_one_side(&syns, CONNECTIONS, true, 0);
    write_one_side(&answers, CONNECTIONS, false, 0);
    let url = server.url();
    firewall_run("fw-full-a", &syns, true, Some(&url), "");
    let small = "[program.firewall]\nconnections = 64\n";
    let full = firewall_run("fw-full-b", &answers, false, Some(&url), small);
    let r = &full["replication"];
    let refused = r["install_refused"].as_u64().unwrap();
    let let_in = full["counters"]["tx_packets"].as_u64().unwrap();
    assert!(refused > 0, "{r}");
    assert_eq!(let_in + refused, u64::from(CONNECTIONS), "{full}");
    assert_eq!(
        full["drops"]["unsolicited"].as_u64(),
        Some(refused),
        "{full}"
    );
    let roomy = firewall_run("fw-full-c", &answers, false, Some(&url), "");
    assert_eq!(roomy["replication"]["install_refused"], 0, "{roomy}");
    assert_eq!(
        roomy["counters"]["tx_packets"],
        u64::from(CONNECTIONS),
        "every state still at the store: {roomy}"
    );
}

/// A connection that timed out at its switch is not taken back from the store: the SYNs'
/// connections time out after 0.5 s without an answer (`new`), the switch has told the
/// store so with each write, and the answers that come to another switch 1.2 s later (a
/// lease and the timeout past) find no connection and are dropped as unsolicited, as they
/// would be at the first switch. The test above, with the default 30 s, is the control.
#[test]
fn a_connection_timed_out_at_its_switch_is_not_granted_back_by_the_store() {
    const CONNECTIONS: u16 = 50;
    let server = stateplane_lab::RedisServer::start(free_port(), false).unwrap();
    let (syns, answers) = (tmp("fw-exp-syns.pcap"), tmp("fw-exp-answers.pcap"));
    write_one_side(&syns, CONNECTIONS, true, 0);
    write_one_side(&answers, CONNECTIONS, false, 0);
    let short = "[program.firewall]\ntimeouts = { new = 0.5 }\n";
    let opened = firewall_run("fw-exp-a", &syns, true, Some(&server.url()), short);
    assert_eq!(
        opened["counters"]["tx_packets"],
        u64::from(CONNECTIONS),
        "{opened}"
    );
    std::thread::sleep(std::time::Duration::from_millis(1_200));
    let late = firewall_run("fw-exp-b", &answers, false, Some(&server.url()), short);
    let r = &late["replication"];
    assert_eq!(late["counters"]["tx_packets"], 0, "{late}");
    assert_eq!(r["migrated"], 0, "every state timed out at the store: {r}");
    assert_eq!(r["processed"], u64::from(CONNECTIONS), "{r}");
    let drops = late.to_string();
    assert!(drops.contains("unsolicited"), "{drops}");
}

/// `sgw` with its sessions replicated to a real Redis: switch A takes the signaling of
/// the `gtp` workload, switch B, another process, only its users' packets. B finds each
/// subscriber's session at the store (uplink names the subscriber by its TEID; downlink
/// only by its address, the alias A wrote with the session) and tunnels every packet as
/// one unreplicated switch that saw all the signaling first does: the same users' packets
/// out of each port, byte for byte (in another order across subscribers: each waits for
/// its own session), A answering every request. Unreplicated, B drops them all as
/// `no_session`, but for the Error Indications it sends their eNodeBs (one every 10 ms).
#[test]
fn sgw_sessions_replicated_to_redis_follow_their_users_to_another_switch() {
    use stateplane_gen::{GenConfig, Workload};
    let server = stateplane_lab::RedisServer::start(free_port(), false).unwrap();
    let mut cfg = GenConfig::new(Workload::Gtp, 10_000);
    cfg.ipv6_share = 0.0;
    let mut frames = Vec::new();
    let keep = |_, f: &[u8]| {
        frames.push(f.to_vec());
        Ok(())
    };
    stateplane_gen::generate(&cfg, keep, |_| {}).unwrap();
    let hasher = stateplane_wire::FlowHasher::with_seed(1);
    let (signaling, data): (Vec<_>, Vec<_>) = frames.into_iter().partition(|f| {
        let parsed = stateplane_wire::parse::parse(f, 0, &hasher).unwrap();
        parsed.flags.has(stateplane_wire::parse::ParseFlags::GTPC)
    });
    // Signaling first, then the users' packets, each at its own time in every capture.
    let timed: Vec<(u64, &Vec<u8>, bool)> = (signaling.iter().map(|f| (f, true)))
        .chain(data.iter().map(|f| (f, false)))
        .enumerate()
        .map(|(i, (f, signal))| (1_000_000_000 + i as u64 * 10_000, f, signal))
        .collect();
    let capture = |name: &str, signals: bool, users: bool| {
        let path = tmp(name);
        let file = std::fs::File::create(&path).unwrap();
        let mut w = stateplane_io::pcap::PcapWriter::new(file, true).unwrap();
        for &(ts, f, signal) in &timed {
            if (signal && signals) || (!signal && users) {
                w.write(ts, f, f.len() as u32).unwrap();
            }
        }
        path
    };
    let (signals, users, both) = (
        capture("sgw-rep-signals.pcap", true, false),
        capture("sgw-rep-users.pcap", false, true),
        capture("sgw-rep-both.pcap", true, true),
    );
    let run = |name: &str, input: &std::path::Path, store: Option<&str>| {
        let config = tmp(&format!("{name}.toml"));
        let replicated = store.map_or(String::new(), |url| {
            format!("[guarantees]\nsessions = [\"replicated\"]\n[replication]\nstore = \"{url}\"\nlease_ms = 200\n")
        });
        let out = |port: &str| tmp(&format!("{name}-{port}.pcap"));
        std::fs::write(
            &config,
            format!(
                "workers = 1\n[program]\nname = \"sgw\"\n[program.sgw]\naddress = \"198.19.255.2\"\n\
                 ue_pool = \"198.18.128.0/17\"\n{replicated}\
                 [[port]]\nname = \"access\"\nrx = \"{}\"\ntx = \"{}\"\n\
                 [[port]]\nname = \"core\"\ntx = \"{}\"\n",
                input.display(),
                out("access").display(),
                out("core").display()
            ),
        )
        .unwrap();
        let summary = run_json(&config);
        // The users' packets, sorted; the signaling's responses go back to the MME.
        let sorted = |port: &str| {
            let (mut frames, mut responses) = (Vec::new(), 0);
            for (f, parsed) in parsed_frames(&out(port)) {
                if parsed.flags.has(stateplane_wire::parse::ParseFlags::GTPC) {
                    responses += 1;
                } else {
                    frames.push(f);
                }
            }
            frames.sort();
            (frames, responses)
        };
        let ((access, responses), (core, _)) = (sorted("access"), sorted("core"));
        (summary, access, core, responses)
    };
    let url = server.url();
    let (a, _, _, answered) = run("sgw-rep-a", &signals, Some(&url));
    assert!(a["replication"]["writes"].as_u64().unwrap() > 50, "{a}");
    assert_eq!(answered, signaling.len(), "A answers every request");
    let (b, b_access, b_core, _) = run("sgw-rep-b", &users, Some(&url));
    let (one, one_access, one_core, _) = run("sgw-rep-one", &both, None);
    let r = &b["replication"];
    assert_eq!(r["dropped"], 0, "{r}");
    assert!(
        r["resolved"].as_u64().unwrap() > 50,
        "downlink found sessions by address: {r}"
    );
    assert!(r["migrated"].as_u64().unwrap() > 50, "{r}");
    assert!(b_access.len() > 3_000 && b_core.len() > 3_000, "{b}");
    assert!(
        b_access == one_access && b_core == one_core,
        "B: {b}\none switch: {one}"
    );
    // Unreplicated, B has no session: users' packets are dropped, but for the Error
    // Indications its eNodeBs get back (at most one every 10 ms of the trace's time).
    let (unreplicated, c_access, c_core, _) = run("sgw-rep-c", &users, None);
    let sent = unreplicated["counters"]["tx_packets"].as_u64().unwrap();
    let no_session = unreplicated["drops"]["no_session"].as_u64().unwrap();
    assert_eq!(sent + no_session, data.len() as u64, "{unreplicated}");
    assert!(
        c_core.is_empty() && c_access.len() as u64 == sent,
        "{unreplicated}"
    );
    let hasher = stateplane_wire::FlowHasher::with_seed(1);
    for f in &c_access {
        let gtp = stateplane_wire::parse::parse(f, 0, &hasher)
            .unwrap()
            .gtp_offset;
        assert_eq!(f[usize::from(gtp) + 1], 26, "an Error Indication");
    }
}

/// `hh` with its sketches in bounded mode on a real Redis: each worker's snapshots reach
/// the store whole (every tenant's sketch counts every packet of the run); a second run
/// as the same switch installs them and counts on (the interval and the tenants' sketches
/// come with the counts), and a run as another switch starts afresh.
#[test]
fn hh_sketches_in_bounded_mode_survive_a_restart_through_redis() {
    use stateplane_bench::bench_snapshots::{StoredSketches, stored_packets, stored_sketch_rows};
    let server = stateplane_lab::RedisServer::start(free_port(), false).unwrap();
    let trace = tmp("bounded-hh.pcap");
    generate(&trace, "internet --packets 20000 --flows 400 --vlans 3");
    let config = |switch: u32| {
        let path = tmp(&format!("bounded-hh-{switch}.toml"));
        std::fs::write(
            &path,
            format!(
                "workers = 2\n[program]\nname = \"hh\"\n[program.hh]\nthreshold = 100000\n\
                 interval_ms = 3600000\nmap = {{ p0 = \"p1\" }}\n\
                 [[port]]\nname = \"p0\"\nrx = \"{}\"\n[[port]]\nname = \"p1\"\ntx = \"{}\"\n\
                 [guarantees]\nsketch = [\"replicated\"]\n\
                 [replication]\nmode = \"bounded\"\nstore = \"{}\"\nswitch = {switch}\n\
                 snapshot_ms = 5\nlease_ms = 200\n",
                trace.display(),
                tmp(&format!("bounded-hh-{switch}-out.pcap")).display(),
                server.url()
            ),
        )
        .unwrap();
        path
    };
    let first = run_json(&config(1));
    let packets = first["counters"]["rx_packets"].as_u64().unwrap();
    assert_eq!(packets, 20_000);
    let r = &first["replication"];
    assert_eq!(r["mode"], "bounded");
    assert!(r["snapshots"].as_u64().unwrap() >= 2, "{r}");
    assert_eq!(r["installed"], 0);
    let total = |stored: &[StoredSketches], switch: u32| stored_packets(stored, switch).unwrap();
    let stored = stored_sketch_rows(&server.url()).unwrap();
    assert_eq!(stored.len(), 2, "one image a worker");
    assert_eq!(
        total(&stored, 1),
        packets,
        "every packet is in the last snapshots"
    );

    let second = run_json(&config(1));
    let r = &second["replication"];
    assert_eq!(r["installed"], 2, "each worker installed its image: {r}");
    assert_eq!(second["counters"]["tx_packets"].as_u64(), Some(packets));
    let stored = stored_sketch_rows(&server.url()).unwrap();
    assert_eq!(total(&stored, 1), 2 * packets, "counted on from the images");

    let other = run_json(&config(2));
    assert_eq!(other["replication"]["installed"], 0);
    let stored = stored_sketch_rows(&server.url()).unwrap();
    assert_eq!(
        total(&stored, 2),
        packets,
        "another switch's sketches start afresh"
    );
    assert_eq!(total(&stored, 1), 2 * packets);
}
