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
