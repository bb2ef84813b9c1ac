//! End to end through the `stateplane` binary, and interoperability with tcpdump and tshark
//! (installed by scripts/test.sh; these tests fail, loudly, where they are missing).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{bin, interrupted_mid_input, ok, refused, sum_of, tmp, tool, write_capture};
use stateplane_io::capture::read_all;
use std::path::Path;

fn generate_trace(workload: &str, packets: u32, path: &Path) {
    generate_with(workload, packets, path, &[]);
}

fn generate_with(workload: &str, packets: u32, path: &Path, extra: &[&str]) {
    ok(bin()
        .args([
            "gen",
            workload,
            "--packets",
            &packets.to_string(),
            "--seed",
            "7",
        ])
        .args(extra)
        .arg("-o")
        .arg(path)
        .output()
        .unwrap());
}

#[test]
fn forward_output_is_identical_packet_for_packet_with_any_worker_count() {
    let input = tmp("fwd-in.pcap");
    generate_trace("internet", 30_000, &input);
    let want = read_all(&input).unwrap();
    for workers in ["1", "3"] {
        let output = tmp(&format!("fwd-out-{workers}.pcapng"));
        let text = ok(bin()
            .args([
                "run",
                "forward",
                "--workers",
                workers,
                "--burst",
                "32",
                "-i",
            ])
            .arg(&input)
            .arg("-o")
            .arg(&output)
            .output()
            .unwrap());
        assert!(
            text.contains("packets out                             30000"),
            "{text}"
        );
        assert_eq!(read_all(&output).unwrap(), want, "with {workers} workers");
    }
}

/// An IPv4 trace of `workload` at `path` whose frames `broken` edits (to break some).
fn generate_broken(
    workload: &str,
    packets: u32,
    path: &Path,
    broken: impl FnOnce(&mut Vec<(u64, Vec<u8>, u32)>),
) {
    generate_with(workload, packets, path, &["--ipv6-share", "0"]);
    let mut frames = read_all(path).unwrap();
    broken(&mut frames);
    write_capture(path, &frames, stateplane_io::CaptureFormat::PcapNano);
}

#[test]
fn json_summary_counts_malformed_by_reason_and_loses_nothing() {
    // A trace with two broken frames among good ones.
    let input = tmp("mixed.pcap");
    generate_broken("udpflood", 1000, &input, |packets| {
        packets[10].1.truncate(30); // IPv4 header cut short
        packets[20].1[14] = 0x65; // IP version 6 in an IPv4 frame
    });
    let out = ok(bin()
        .args(["run", "forward", "--workers", "2", "--json", "-i"])
        .arg(&input)
        .output()
        .unwrap());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["counters"]["rx_packets"], 1000);
    assert_eq!(v["counters"]["tx_packets"], 998);
    assert_eq!(v["counters"]["malformed"], 2);
    assert_eq!(v["malformed"]["ipv4_truncated"], 1);
    assert_eq!(v["malformed"]["ipv4_bad_header"], 1);
    assert_eq!(v["drops"]["malformed"], 2);
    let per_worker: u64 = v["per_worker_rx_packets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .sum();
    assert_eq!(per_worker, 998, "workers saw every well-formed packet once");
}

/// A pcap output cannot hold a time past 2106: a packet forwarded to it after that is
/// dropped as `not_written` (not counted as sent), the earlier ones are written, the run
/// ends well; a pcapng output holds them all.
#[test]
fn packets_an_output_cannot_hold_are_dropped_not_sent() {
    let input = tmp("late.pcapng");
    generate_trace("internet", 100, &input);
    let mut frames = read_all(&input).unwrap();
    // The last 30 packets in 2107 (pcap's seconds field ends at 2^32 - 1, in 2106).
    let late = 4_354_819_200 * 1_000_000_000u64;
    for (i, f) in frames.iter_mut().enumerate().skip(70) {
        f.0 = late + i as u64;
    }
    write_capture(&input, &frames, stateplane_io::CaptureFormat::Pcapng);
    let late_bytes: u64 = frames[70..].iter().map(|f| f.1.len() as u64).sum();
    for (output, written) in [("late-out.pcap", 70), ("late-out.pcapng", 100)] {
        let out = tmp(output);
        let run = bin()
            .args(["run", "forward", "--workers", "2", "--json", "-i"])
            .arg(&input)
            .arg("-o")
            .arg(&out)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&ok(run.clone())).unwrap();
        let c = &v["counters"];
        let not_written = 100 - written;
        assert_eq!(c["rx_packets"], 100, "{v}");
        assert_eq!(
            (&c["tx_packets"], &c["dropped"]),
            (&written.into(), &not_written.into()),
            "{v}"
        );
        assert_eq!(read_all(&out).unwrap().len() as u64, written);
        assert_eq!(v["ports"][1]["tx_packets"], written, "{v}");
        if not_written > 0 {
            assert_eq!(v["drops"]["not_written"], not_written, "{v}");
            let rx_bytes = c["rx_bytes"].as_u64().unwrap();
            assert_eq!(
                c["tx_bytes"].as_u64().unwrap(),
                rx_bytes - late_bytes,
                "{v}"
            );
            let err = String::from_utf8_lossy(&run.stderr);
            assert!(err.contains("timestamp beyond 2106; such packets are dropped as not_written (a .pcapng output holds them)"), "{err}");
        }
    }
    // A file whose writes fail (a full disk): what its buffer held is lost, and none of
    // it counts as sent; the run says why and fails.
    let big = tmp("full-in.pcap");
    generate_trace("internet", 5000, &big);
    let run = bin()
        .args(["run", "forward", "--json", "-i"])
        .arg(&big)
        .args(["-o", "/dev/full"])
        .output()
        .unwrap();
    assert!(!run.status.success());
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let c = &v["counters"];
    assert!(c["rx_packets"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(
        (&c["tx_packets"], &c["tx_bytes"]),
        (&0.into(), &0.into()),
        "{v}"
    );
    assert_eq!(v["drops"]["not_written"], c["rx_packets"], "{v}");
    assert_eq!(v["ports"][1]["tx_packets"], 0, "{v}");
    let errors = v["errors"].to_string();
    assert!(errors.contains("No space left on device"), "{errors}");
}

#[test]
fn errors_name_the_field_and_the_fix() {
    let input = tmp("err-in.pcap");
    generate_trace("kv", 100, &input);
    let cfg = tmp("bad.toml");
    std::fs::write(&cfg, "workers = 2\n[program]\nname = \"l2\"\n[program.l2]\nmacs = [ { mac = \"02:00:00:00:00:02\", port = \"nowhere\" } ]\n[[port]]\nname = \"in\"\nrx = \"x\"\n").unwrap();
    let out = bin().args(["run", "--config"]).arg(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("program.l2.macs[0].port: there is no port 'nowhere'; the ports are: in"),
        "{err}"
    );
    std::fs::write(&cfg, "wrokers = 2\n").unwrap();
    let err = String::from_utf8_lossy(
        &bin()
            .args(["run", "--config"])
            .arg(&cfg)
            .output()
            .unwrap()
            .stderr,
    )
    .into_owned();
    assert!(err.contains("wrokers"), "{err}");
    let err = String::from_utf8_lossy(
        &bin()
            .args(["run", "--burst", "0", "-i"])
            .arg(&input)
            .output()
            .unwrap()
            .stderr,
    )
    .into_owned();
    assert!(err.contains("--burst: 0 is outside 1 to 1024"), "{err}");
    let err = String::from_utf8_lossy(
        &bin()
            .args(["run", "--metrics", "198.18.0.1:9000", "-i"])
            .arg(&input)
            .output()
            .unwrap()
            .stderr,
    )
    .into_owned();
    assert!(err.contains("not a loopback address"), "{err}");
    let err = String::from_utf8_lossy(
        &bin()
            .args(["gen", "internet", "--ipv6-share", "2", "-o"])
            .arg(tmp("x.pcap"))
            .output()
            .unwrap()
            .stderr,
    )
    .into_owned();
    assert!(err.contains("--ipv6-share: 2 is not a share"), "{err}");
    // `-` is not taken for a file's name (it once left a capture called `-` behind).
    refused(
        &["gen", "internet", "--packets", "10", "-o", "-"],
        "gen writes a capture file, not standard output",
    );
    assert!(!Path::new("-").exists());
    // bench's settings that would go unused are refused, naming the fix.
    refused(
        &["bench", "--programs", "forward", "--capacity", "5"],
        "--capacity sizes conntrack's table; add conntrack to --programs",
    );
    let trace = input.to_str().unwrap();
    refused(
        &["bench", "--trace", trace, "--flows", "10"],
        "--flows shapes a generated trace; --trace replays one as it is",
    );
    // A capture of a link type no switch sees is refused by name, with those it reads.
    let mut bytes = std::fs::read(&input).unwrap();
    bytes[20..24].copy_from_slice(&127u32.to_le_bytes());
    let radiotap = tmp("radiotap.pcap");
    std::fs::write(&radiotap, bytes).unwrap();
    let err = (bin().args(["run", "-i"]).arg(&radiotap).output().unwrap()).stderr;
    let err = String::from_utf8_lossy(&err).into_owned();
    assert!(err.contains("link type 127 (IEEE802_11_RADIOTAP) is not one Stateplane reads: it reads Ethernet (1), Linux cooked SLL (113) and SLL2 (276)"), "{err}");
    // In pcapng too, as the file opens: the error alone, no summary of a run of nothing.
    let wifi_ng = tmp("wifi.pcapng");
    ok(bin()
        .args(["gen", "internet", "--packets", "10", "-o"])
        .arg(&wifi_ng)
        .output()
        .unwrap());
    let mut bytes = std::fs::read(&wifi_ng).unwrap();
    bytes[28 + 8..28 + 10].copy_from_slice(&105u16.to_le_bytes()); // the first IDB's
    std::fs::write(&wifi_ng, bytes).unwrap();
    let out = (bin().args(["run", "forward", "-o"]))
        .arg(tmp("wifi-out.pcap"))
        .arg("-i")
        .arg(&wifi_ng)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success());
    assert!(stderr.contains("link type 105 (IEEE802_11"), "{stderr}");
    assert!(!stdout.contains("packets in"), "{stdout}");
}

/// The control API's endpoint: a TCP address beyond loopback is refused unless TLS and a
/// token or client certificates guard it, TLS settings that would guard nothing are
/// refused, and a run over files (which has no control API) refuses `--control`; each
/// refusal names the settings that fix it. (The guarded endpoints themselves are tested in
/// the control crate's grpc tests, the default socket in the lab's.)
#[test]
fn control_endpoints_beyond_loopback_need_a_guard_and_settings_never_go_unused() {
    let input = tmp("control-in.pcap");
    generate_trace("internet", 10, &input);
    let token = tmp("control-token");
    std::fs::write(&token, "0123456789abcdef0123\n").unwrap();
    let token = token.to_str().unwrap();
    let live = ["run", "forward", "-I", "sp-none0", "-I", "sp-none1"];
    let cases: [(Vec<&str>, &str); 6] = [
        (
            [&live[..], &["--control", "0.0.0.0:9559"]].concat(),
            "needs TLS and a way to tell clients apart: give --control-cert FILE and --control-key FILE, and --control-token-file FILE or --control-client-ca FILE",
        ),
        (
            [&live[..], &["--control-token-file", token]].concat(),
            "give --control HOST:PORT too",
        ),
        (
            [
                &live[..],
                &[
                    "--control",
                    "unix:/run/x.sock",
                    "--control-token-file",
                    token,
                ],
            ]
            .concat(),
            "is a Unix socket, which its file mode guards",
        ),
        (
            [
                &live[..],
                &["--control", "off", "--control-token-file", token],
            ]
            .concat(),
            "--control off: the control API's TLS settings guard nothing",
        ),
        (
            [
                &live[..],
                &[
                    "--control",
                    "198.18.0.1:9559",
                    "--control-token-file",
                    token,
                ],
            ]
            .concat(),
            "needs both --control-cert FILE",
        ),
        (
            vec![
                "run",
                "--control",
                "127.0.0.1:9559",
                "-i",
                input.to_str().unwrap(),
            ],
            "--control and its TLS settings are for live runs",
        ),
    ];
    for (args, says) in cases {
        let out = bin().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was taken");
        assert!(
            err.contains(says) && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    // The client: a collector's address is needed for `ctl sync`, and TLS settings that
    // cannot apply are refused before anything is sent.
    for (args, says) in [
        (&["ctl", "sync", "streams"][..], "give --server ADDR"),
        (
            &[
                "ctl",
                "--server",
                "unix:/run/x.sock",
                "--ca",
                token,
                "describe",
            ][..],
            "is a Unix socket: its file mode guards it",
        ),
        (
            &["ctl", "--server", "https://127.0.0.1:1", "describe"][..],
            "TLS to https://127.0.0.1:1 needs --ca FILE",
        ),
        // No switch there: where a switch's socket would be, and how to point ctl at it.
        (
            &[
                "ctl",
                "--server",
                "unix:/nonexistent/control.sock",
                "describe",
            ][..],
            "control.sock in its run directory: $STATEPLANE_RUN_DIR, else /run/stateplane for root",
        ),
    ] {
        let out = bin().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was taken");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// `bench` reports a program that fails beside the ones it measured, instead of throwing
/// them away: a trace with a frame that does not parse makes `forward` forward one packet
/// short, and the run prints the baseline's row, says why forward failed, and exits 1.
#[test]
fn bench_keeps_the_rows_it_measured_when_a_program_fails() {
    let input = tmp("bench-mixed.pcap");
    generate_broken("internet", 500, &input, |packets| {
        packets[10].1.truncate(30); // IPv4 header cut short
    });
    let out = bin()
        .args([
            "bench",
            "--loops",
            "1",
            "--repeat",
            "1",
            "--programs",
            "rx,forward",
            "--trace",
        ])
        .arg(&input)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("rx ") && l.contains(" 500 ")),
        "the baseline's row stays: {stdout}"
    );
    assert!(
        stdout.contains("forward") && stdout.contains("FAILED"),
        "the failure has a row: {stdout}"
    );
    assert!(
        stderr.contains("forward: forwarded 499 of 500 packets; the benchmark expects all"),
        "{stderr}"
    );
}

/// A trace that is not there (a first run's, not made yet) is named with the way to make
/// one, by `run` (a flag and a configuration's port) and by `flows`.
#[test]
fn a_missing_trace_is_named_with_the_command_that_makes_one() {
    let gone = tmp("not-made-yet.pcap");
    let gone = gone.to_str().unwrap();
    let fix = "no such file; write a trace with `stateplane gen internet -o FILE`";
    refused(
        &["run", "forward", "-i", gone],
        &format!("port in0 (rx {gone}): {fix}"),
    );
    refused(&["flows", "-i", gone], &format!("--in {gone}: {fix}"));
    let config = tmp("missing-trace.toml");
    std::fs::write(
        &config,
        "[program]\nname = \"forward\"\n[[port]]\nname = \"uplink\"\nrx = \"nowhere.pcap\"\n",
    )
    .unwrap();
    refused(
        &["run", "--config", config.to_str().unwrap()],
        "port uplink (rx ",
    );
    refused(&["run", "--config", config.to_str().unwrap()], fix);
}

#[test]
fn metrics_endpoint_serves_prometheus_text() {
    let input = tmp("metrics-in.pcap");
    generate_trace("internet", 2000, &input);
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let metrics = format!("127.0.0.1:{port}");
    let mut run = bin();
    run.args([
        "run",
        "forward",
        "--hold-metrics",
        "20",
        "--metrics",
        &metrics,
    ]);
    // Until the run is over and the totals are final.
    let text = &common::metrics_of_held_run(run.arg("-i").arg(&input), port, |b| {
        b.contains("stateplane_rx_packets_total{worker=\"0\"} 2000\n")
    });
    // Prometheus' own checker takes it as it is, and the Grafana dashboard's panels on
    // traffic, workers and memory query families it serves (ports and tables: the lab's
    // live switches; flow export: a run with [flows]).
    let elsewhere = [
        "stateplane_port_",
        "stateplane_table_",
        "stateplane_flow",
        "stateplane_cache_",
        "stateplane_control_",
    ];
    common::assert_scrape_sound(text, |f| !elsewhere.iter().any(|p| f.starts_with(p)));
    assert!(common::dashboard_families("stateplane_").len() >= 15);
    assert!(
        text.contains("# TYPE stateplane_rx_packets_total counter\n"),
        "{text}"
    );
    // One series per thread and none for the total: `sum()` over a family counts each
    // packet once.
    for (family, want) in [
        ("stateplane_rx_packets_total", 2000),
        ("stateplane_tx_packets_total", 2000),
        ("stateplane_dropped_total", 0),
    ] {
        assert_eq!(sum_of(text, family), want, "{family}: {text}");
    }
    assert!(
        text.contains("stateplane_tx_packets_total{worker=\"0\"} 2000\n"),
        "{text}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("stateplane_rx_packets_total ")),
        "no unlabelled total beside the per-thread series: {text}"
    );
    // Every reason is listed from the first scrape, at 0 until it counts: a family is never
    // a type line with no samples.
    for reason in [
        "stateplane_drops_total{reason=\"no_verdict\"} 0\n",
        "stateplane_malformed_packets_total{reason=\"ethernet_truncated\"} 0\n",
    ] {
        assert!(text.contains(reason), "{reason}: {text}");
    }
    // The bounds it runs within, beside what fills them.
    for bound in [
        "# TYPE stateplane_memory_budget_bytes gauge",
        "stateplane_queue_depth_bursts 8\n",
        "stateplane_burst_packets 64\n",
    ] {
        assert!(text.contains(bound), "{bound}: {text}");
    }
}

/// A run over files serves what its summary prints and more: each port's packets read and
/// written, a pipeline's rules and microflow cache, and a table's counts and bytes, while
/// it runs and, final, after it has ended.
#[test]
fn a_run_over_files_serves_its_ports_rules_cache_and_tables() {
    let input = tmp("file-metrics-in.pcap");
    generate_with("internet", 20_000, &input, &["--ipv6-share", "0"]);
    std::fs::write(
        tmp("file-metrics.rules"),
        "table=0,priority=300,udp,actions=drop\n\
         table=0,priority=10,ip,actions=output:1\n\
         table=0,priority=1,actions=output:2\n",
    )
    .unwrap();
    let cfg = tmp("file-metrics.toml");
    std::fs::write(
        &cfg,
        "workers = 2\n[program]\nname = \"pipeline\"\n[program.pipeline]\ntables = 1\nrules_file = \"file-metrics.rules\"\ncache_entries = 4096\n\
         [[port]]\nname = \"in\"\nrx = \"file-metrics-in.pcap\"\n[[port]]\nname = \"ip\"\n[[port]]\nname = \"other\"\n",
    )
    .unwrap();
    let port = 20_000 + (std::process::id() % 20_000) as u16 + 1;
    let metrics = format!("127.0.0.1:{port}");
    let summary = tmp("file-metrics.json");
    // The summary appears whole once the run is over (written aside, then renamed).
    let _ = std::fs::remove_file(&summary);
    let mut run = bin();
    run.args(["run", "--hold-metrics", "20", "--metrics", &metrics]);
    run.arg("--summary-file")
        .arg(&summary)
        .arg("--config")
        .arg(&cfg);
    // Once the summary is written the run is over and the counts final.
    let text = &common::metrics_of_held_run(&mut run, port, |_| summary.exists());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    // The dashboard's panels on live ports, tables and flow export have other tests.
    let file_ports = ["rx_packets", "rx_bytes", "tx_packets", "tx_bytes"]
        .map(|c| format!("stateplane_port_{c}_total"));
    common::assert_scrape_sound(text, |f| match f.strip_prefix("stateplane_") {
        Some(rest) if rest.starts_with("port_") => file_ports.iter().any(|p| p == f),
        Some(rest) => !["flow", "table_", "control_"]
            .iter()
            .any(|p| rest.starts_with(p)),
        None => true,
    });
    let value = |line: &str| -> u64 {
        (text.lines())
            .find_map(|l| l.strip_prefix(line)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{line}: {text}"))
    };
    assert_eq!(
        value("stateplane_port_rx_packets_total{port=\"in\"}"),
        20_000
    );
    for (i, name) in ["in", "ip", "other"].iter().enumerate() {
        for (family, field) in [("tx_packets", "tx_packets"), ("tx_bytes", "tx_bytes")] {
            let line = format!("stateplane_port_{family}_total{{port=\"{name}\"}}");
            assert_eq!(
                value(&line),
                summary["ports"][i][field],
                "{line}: {summary}"
            );
        }
    }
    // Every packet parsed is looked up in a worker's cache: a hit, or a miss classified.
    let rx = summary["counters"]["rx_packets"].as_u64().unwrap();
    let (hits, misses) = (
        value("stateplane_cache_hits_total{table=\"flows\"}"),
        value("stateplane_cache_misses_total{table=\"flows\"}"),
    );
    assert_eq!(hits + misses, rx, "{text}");
    assert!(misses > 0 && hits > misses, "{text}");
    assert_eq!(
        value("stateplane_cache_inserts_total{table=\"flows\"}"),
        misses
    );
    assert_eq!(value("stateplane_rules{table=\"flows\"}"), 3);
    // A table's counts and bytes: conntrack's, over the same trace.
    let mut run = bin();
    run.args([
        "run",
        "conntrack",
        "--hold-metrics",
        "20",
        "--metrics",
        &metrics,
    ]);
    let lookups = "stateplane_table_lookups_total{table=\"connections\"} 20000\n";
    let body =
        common::metrics_of_held_run(run.arg("-i").arg(&input), port, |b| b.contains(lookups));
    assert!(body.contains(lookups), "{body}");
    let bytes = (body.lines())
        .find_map(|l| l.strip_prefix("stateplane_table_bytes{table=\"connections\"} "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(bytes > Some(65_536 * 64), "{body}");
}

#[test]
fn tshark_and_tcpdump_read_ours_and_we_read_theirs() {
    let ours = tmp("interop.pcap");
    generate_trace("internet", 3000, &ours);
    let ours_ng = tmp("interop-ours.pcapng");
    ok(bin()
        .args(["run", "forward", "-i"])
        .arg(&ours)
        .arg("-o")
        .arg(&ours_ng)
        .output()
        .unwrap());
    let want = read_all(&ours).unwrap();
    for file in [&ours, &ours_ng] {
        // tshark decodes every frame, with no malformed packet and no expert error (its
        // warnings about the synthetic traffic itself, like unseen TCP segments, are fine).
        const EXPERT_ERROR: &str = "8388608";
        let out = ok(tool("tshark")
            .args(["-n", "-r"])
            .arg(file)
            .args([
                "-T",
                "fields",
                "-e",
                "frame.number",
                "-e",
                "_ws.malformed",
                "-e",
                "_ws.expert.severity",
            ])
            .output()
            .unwrap());
        assert_eq!(
            out.lines().count(),
            3000,
            "tshark frames of {}",
            file.display()
        );
        for line in out.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            assert!(
                fields.get(1).is_none_or(|m| m.is_empty()),
                "tshark: malformed frame in {}: {line}",
                file.display()
            );
            assert!(
                !fields.get(2).is_some_and(|s| s.contains(EXPERT_ERROR)),
                "tshark: expert error in {}: {line}",
                file.display()
            );
        }
        let count = ok(tool("tcpdump")
            .args(["-nn", "-r"])
            .arg(file)
            .output()
            .unwrap());
        assert_eq!(count.lines().count(), 3000);
    }
    // Files written by tcpdump and tshark, and converted by editcap, read back equal.
    let by_tcpdump = tmp("by-tcpdump.pcap");
    ok(tool("tcpdump")
        .args(["-r"])
        .arg(&ours)
        .arg("-w")
        .arg(&by_tcpdump)
        .output()
        .unwrap());
    let micro: Vec<_> = want
        .iter()
        .map(|(ts, d, l)| (ts / 1000 * 1000, d.clone(), *l))
        .collect();
    assert_eq!(read_all(&by_tcpdump).unwrap(), want);
    // tshark writes pcapng with nanosecond timestamps by default.
    let by_tshark = tmp("by-tshark.pcapng");
    ok(tool("tshark")
        .args(["-r"])
        .arg(&ours)
        .arg("-w")
        .arg(&by_tshark)
        .output()
        .unwrap());
    assert_eq!(
        read_all(&by_tshark).unwrap(),
        want,
        "a pcapng written by tshark"
    );
    for (format, expect) in [("pcapng", &want), ("nsecpcap", &want), ("pcap", &micro)] {
        let converted = tmp(&format!("by-editcap.{format}"));
        ok(tool("editcap")
            .args(["-F", format])
            .arg(&ours)
            .arg(&converted)
            .output()
            .unwrap());
        assert_eq!(
            &read_all(&converted).unwrap(),
            expect,
            "editcap -F {format}"
        );
    }
}

/// What `tcpdump -i any` writes (Linux cooked capture v2, link type 276): 10 datagrams
/// the test sends on loopback. `flows` counts them as tcpdump does, in one flow of their
/// bytes; `run` hands them to a program behind a synthesized Ethernet header, and writes an
/// Ethernet capture that tshark reads as the same datagrams.
#[test]
fn a_capture_by_tcpdump_on_any_interface_is_read_whole() {
    // The datagrams go to a socket of the test's own, so nothing else answers them.
    let receiver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = receiver.local_addr().unwrap().port();
    let capture = tmp("any.pcap");
    let mut tcpdump = tool("tcpdump")
        .args(["-i", "any", "-nn", "-U", "-c", "10", "-w"])
        .arg(&capture)
        .arg(format!("udp and dst port {port} and host 127.0.0.1"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its first line of standard error says it listens (or why it cannot).
    let mut err = std::io::BufReader::new(tcpdump.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("listening on") {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut err, &mut line).unwrap() == 0 {
            panic!("tcpdump -i any did not start (it needs root): {said}");
        }
        said += &line;
    }
    assert!(said.contains("LINUX_SLL2"), "{said}");
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 1..=10 {
        socket.send_to(&vec![b'x'; i], ("127.0.0.1", port)).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while tcpdump.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            tcpdump.kill().unwrap();
            panic!("tcpdump did not see 10 datagrams in 10 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let read_by_tcpdump = ok(tool("tcpdump")
        .args(["-nn", "-r"])
        .arg(&capture)
        .output()
        .unwrap());
    assert_eq!(read_by_tcpdump.lines().count(), 10, "{read_by_tcpdump}");
    let csv = tmp("any.csv");
    let summary = ok(bin()
        .args(["flows", "--summary-json", "-i"])
        .arg(&capture)
        .arg("--csv")
        .arg(&csv)
        .output()
        .unwrap());
    let summary: serde_json::Value = serde_json::from_str(summary.trim()).unwrap();
    assert_eq!(
        (summary["packets"].as_u64(), summary["not_ip"].as_u64()),
        (Some(10), Some(0))
    );
    let records = std::fs::read_to_string(&csv).unwrap();
    // One flow: 10 packets of 28 header bytes and 1 to 10 payload bytes.
    let row = records.lines().nth(1).unwrap();
    assert!(row.contains(&format!(",{port},17,10,335,")), "{records}");
    let out = tmp("any-out.pcap");
    ok(bin()
        .args(["run", "forward", "-i"])
        .arg(&capture)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap());
    let fields = ok(tool("tshark")
        .args(["-n", "-r"])
        .arg(&out)
        .args([
            "-T",
            "fields",
            "-e",
            "eth.type",
            "-e",
            "udp.dstport",
            "-e",
            "udp.length",
        ])
        .output()
        .unwrap());
    let want: Vec<String> = (1..=10)
        .map(|i| format!("0x0800\t{port}\t{}", 8 + i))
        .collect();
    assert_eq!(fields.lines().collect::<Vec<_>>(), want);
}

#[test]
fn config_paths_are_relative_to_the_config_file() {
    let input = tmp("relative-in.pcap");
    generate_trace("datacenter", 500, &input);
    let cfg = tmp("relative.toml");
    std::fs::write(&cfg, "[[port]]\nname = \"a\"\nrx = \"relative-in.pcap\"\n[[port]]\nname = \"b\"\ntx = \"relative-out.pcap\"\n").unwrap();
    // Run from another directory: the paths still resolve beside the config.
    ok(bin()
        .current_dir("/")
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap());
    assert_eq!(
        read_all(&tmp("relative-out.pcap")).unwrap(),
        read_all(&input).unwrap()
    );
}

/// Connection tracking keeps per-connection state in each worker, so both directions of a
/// connection must meet in one worker: with the connection hash they do, and the output is
/// the same packet for packet with one worker or three.
#[test]
fn conntrack_output_is_the_same_with_any_worker_count() {
    let input = tmp("ct-in.pcap");
    generate_trace("datacenter", 40_000, &input);
    let mut outputs = Vec::new();
    for workers in ["1", "3"] {
        let output = tmp(&format!("ct-out-{workers}.pcap"));
        let text = ok(bin()
            .args(["run", "conntrack", "--json", "--workers", workers, "-i"])
            .arg(&input)
            .arg("-o")
            .arg(&output)
            .output()
            .unwrap());
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let out = v["counters"]["tx_packets"].as_u64().unwrap();
        assert!(
            out > 20_000,
            "most packets belong to tracked connections: {v}"
        );
        outputs.push((read_all(&output).unwrap(), v["drops"].clone()));
    }
    assert_eq!(outputs[0].1, outputs[1].1, "the same drops by reason");
    assert!(
        outputs[0].0 == outputs[1].0,
        "the same output, packet for packet"
    );
}

/// The `pipeline` program end to end, its rules in a file beside the configuration: an ACL
/// that drops UDP, then routes that decrement the TTL and rewrite the next hop's MAC. The
/// cache changes nothing (the output is the same packet for packet with it off or in any
/// mode, with one worker or three); every TCP packet leaves, rewritten, with a valid IPv4
/// header checksum; every UDP packet is dropped and counted by reason.
#[test]
fn pipeline_output_is_the_same_with_its_cache_in_any_mode() {
    use stateplane_wire::{FlowHasher, ipv4::Ipv4Packet};
    let input = tmp("pl-in.pcap");
    generate_with("internet", 30_000, &input, &["--ipv6-share", "0"]);
    std::fs::write(
        tmp("pl.rules"),
        "# the ACL\n\
         table=0,priority=300,udp,actions=drop\n\
         table=0,priority=10,ip,actions=goto_table:1\n\
         # the routes\n\
         table=1,priority=16,ip,nw_dst=198.19.0.0/16,actions=dec_ttl,mod_dl_dst:02:00:00:00:0b:02,output:1\n\
         table=1,priority=15,ip,nw_dst=198.18.0.0/15,actions=dec_ttl,mod_dl_dst:02:00:00:00:0b:01,output:1\n",
    )
    .unwrap();
    let hasher = FlowHasher::with_seed(1);
    let frames = read_all(&input).unwrap();
    let parsed: Vec<_> = (frames.iter())
        .map(|(_, f, _)| stateplane_wire::parse(f, 0, &hasher).unwrap())
        .collect();
    let udp = parsed.iter().filter(|p| p.key.proto == 17).count() as u64;
    let tcp: Vec<usize> = (0..frames.len())
        .filter(|&i| parsed[i].key.proto == 6)
        .collect();
    assert!(udp > 100 && tcp.len() > 10_000, "the trace has both");
    let mut outputs = Vec::new();
    for (cache, workers) in [
        ("off", "1"),
        ("action", "1"),
        ("action", "3"),
        ("cookie", "2"),
        ("strong", "3"),
    ] {
        let name = format!("pl-{cache}-{workers}");
        let cfg = tmp(&format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[program]\nname = \"pipeline\"\n[program.pipeline]\ntables = 2\nrules_file = \"pl.rules\"\ncache = \"{cache}\"\ncache_entries = 4096\n\
                 [[port]]\nname = \"in\"\nrx = \"pl-in.pcap\"\n[[port]]\nname = \"out\"\ntx = \"{name}.pcap\"\n"
            ),
        )
        .unwrap();
        let v = summary_of_config(&cfg, workers);
        assert_eq!(
            v["drops"]["no_output"], udp,
            "{cache}: UDP dropped by the ACL: {v}"
        );
        assert_eq!(
            v["counters"]["tx_packets"],
            tcp.len() as u64,
            "{cache}: {v}"
        );
        outputs.push(read_all(&tmp(&format!("{name}.pcap"))).unwrap());
    }
    for (i, out) in outputs.iter().enumerate().skip(1) {
        assert!(
            out == &outputs[0],
            "run {i}: the same output as with no cache"
        );
    }
    for (&at, (_, sent, _)) in tcp.iter().zip(&outputs[0]) {
        let (before, after) = (
            &parsed[at],
            stateplane_wire::parse(sent, 0, &hasher).unwrap(),
        );
        let l3 = usize::from(after.l3_offset);
        assert_eq!(after.ttl, before.ttl - 1);
        assert_eq!(
            sent[5],
            if before.key.dst[1] == 19 { 2 } else { 1 },
            "next hop's MAC"
        );
        assert!(
            Ipv4Packet::new_checked(&sent[l3..])
                .unwrap()
                .verify_checksum()
        );
    }
}

/// A rule's timeout runs by the capture's clock over files, as live by the system's: a
/// rule dropping IPv4 for a second of a four-second trace drops the first second's IPv4
/// and no more than two seconds' (timeouts are checked once a second), and the rest goes
/// out by the rule beneath it. On two workers, each keeps its own capture clock: the one
/// that did not find the rule expired may trail the other by the bursts queued for it
/// (8 of 64 packets a worker, and the one in hand), and stops matching the rule that much
/// capture time early (docs/cli.md).
#[test]
fn rule_timeouts_expire_by_the_capture_clock_in_a_run_over_files() {
    let input = tmp("timeout-in.pcap");
    generate_with("internet", 20_000, &input, &["--duration", "4"]);
    std::fs::write(
        tmp("timeout.rules"),
        "table=0,priority=100,hard_timeout=1,ip,actions=drop
         table=0,priority=1,actions=output:1
",
    )
    .unwrap();
    let frames = read_all(&input).unwrap();
    let start = frames[0].0;
    let ipv4_before = |secs: f64| {
        (frames.iter())
            .filter(|(ts, f, _)| f[12..14] == [0x08, 0x00] && ((ts - start) as f64) < secs * 1e9)
            .count() as u64
    };
    let (first_second, two_seconds) = (ipv4_before(1.0), ipv4_before(2.0));
    assert!(first_second > 2_000 && two_seconds < ipv4_before(4.1));
    let trailing = |workers: f64| (8.0 + 1.0) * 64.0 * workers / 5_000.0;
    for (workers, least) in [("1", first_second), ("2", ipv4_before(1.0 - trailing(2.0)))] {
        let cfg = tmp(&format!("timeout-{workers}.toml"));
        std::fs::write(
            &cfg,
            "[program]\nname = \"pipeline\"\n[program.pipeline]\ntables = 1\nrules_file = \"timeout.rules\"\n\
             [[port]]\nname = \"in\"\nrx = \"timeout-in.pcap\"\n[[port]]\nname = \"out\"\n",
        )
        .unwrap();
        let v = summary_of_config(&cfg, workers);
        let dropped = v["drops"]["no_output"].as_u64().unwrap_or(0);
        assert!(
            (least..=two_seconds).contains(&dropped),
            "{workers} worker(s): {dropped} dropped, {least} IPv4 packets before the rule may go, {two_seconds} in two seconds: {v}"
        );
        assert_eq!(v["counters"]["tx_packets"], 20_000 - dropped, "{v}");
    }
}

/// Programs chained in the configuration, with flow records behind them: `acl` drops IPv4
/// UDP, `nat` gives the rest of IPv4 the external address, `router` sends it out; the drops
/// are counted under each stage's name and the flow records see the packets as they leave.
#[test]
fn a_chain_of_acl_nat_and_router_runs_from_its_config_with_flow_records() {
    let input = tmp("chain-in.pcap");
    generate_trace("internet", 20_000, &input);
    let cfg = tmp("chain.toml");
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/chain.toml"),
    )
    .unwrap()
    .replace("../out/sample.pcap", "chain-in.pcap")
    .replace("../out/chain-", "chain-");
    std::fs::write(&cfg, text).unwrap();
    let out = ok(bin()
        .args(["run", "--json", "--config"])
        .arg(&cfg)
        .output()
        .unwrap());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let denied = v["drops"]["acl.denied"].as_u64().unwrap_or(0);
    assert!(denied > 500, "UDP is denied by the first stage: {v}");
    assert!(
        v["counters"]["tx_packets"].as_u64().unwrap() > 15_000,
        "{v}"
    );
    let csv = std::fs::read_to_string(tmp("chain-flows.csv")).unwrap();
    let mut left = 0;
    for line in csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f[12] != "1" {
            continue;
        }
        left += 1;
        // `acl` and `nat` work on IPv4; IPv6 passes both.
        if !f[0].contains(':') {
            assert_ne!(f[4], "17", "no IPv4 UDP leaves: {line}");
            assert_eq!(
                f[0], "198.18.255.1",
                "IPv4 leaves from the external address: {line}"
            );
        }
    }
    assert!(left > 500, "flows leave by the outside port: {left}");
}

/// A capture file's records: timestamp, bytes, length on the wire.
type Records = Vec<(u64, Vec<u8>, u32)>;

/// What a run of `cfg` wrote to each of `written`, for each number of `workers`; each run
/// sent `sent` packets in all.
/// The JSON summary of `stateplane run --config cfg` on `workers` workers, which must
/// succeed.
fn summary_of_config(cfg: &Path, workers: &str) -> serde_json::Value {
    let text = ok(bin()
        .args(["run", "--json", "--workers", workers, "--config"])
        .arg(cfg)
        .output()
        .unwrap());
    serde_json::from_str(&text).unwrap()
}

fn outputs_by_workers(
    cfg: &Path,
    workers: &[&str],
    sent: u64,
    written: &[std::path::PathBuf],
) -> Vec<Vec<Records>> {
    (workers.iter())
        .map(|workers| {
            let v = summary_of_config(cfg, workers);
            assert_eq!(v["counters"]["tx_packets"].as_u64(), Some(sent), "{v}");
            (written.iter()).map(|f| read_all(f).unwrap()).collect()
        })
        .collect()
}

/// `lb` reads its Maglev tables with a fixed hash and each worker keeps the affinity of
/// its own connections, so which backend a request reaches does not depend on the
/// workers: the output of the `kv` workload through a VIP of four backends is the same
/// packet for packet with one worker or three, and every request reaches a backend.
#[test]
fn lb_output_is_the_same_with_any_worker_count() {
    let input = tmp("lb-in.pcap");
    generate_with("kv", 30_000, &input, &["--ipv6-share", "0"]);
    let cfg = tmp("lb.toml");
    std::fs::write(
        &cfg,
        "[program]\nname = \"lb\"\n[program.lb]\nclients = \"in\"\nservers = \"out\"\n\
         [[program.lb.vips]]\naddress = \"198.19.0.100\"\nport = 9000\nproto = \"udp\"\n\
         backends = [{ address = \"198.18.200.1\" }, { address = \"198.18.200.2\" }, \
         { address = \"198.18.200.3\" }, { address = \"198.18.200.4\" }]\n\
         [[port]]\nname = \"in\"\nrx = \"lb-in.pcap\"\n[[port]]\nname = \"out\"\ntx = \"lb-out.pcap\"\n",
    )
    .unwrap();
    let outputs: Vec<_> = outputs_by_workers(&cfg, &["1", "3"], 30_000, &[tmp("lb-out.pcap")])
        .into_iter()
        .map(|mut files| files.remove(0))
        .collect();
    assert!(
        outputs[0] == outputs[1],
        "the same output, packet for packet"
    );
    // Every request went to one of the backends, and all four got some.
    let mut backends = std::collections::BTreeMap::new();
    let hasher = stateplane_wire::FlowHasher::with_seed(1);
    for (_, frame, _) in &outputs[0] {
        let key = stateplane_wire::parse(frame, 0, &hasher).unwrap().key;
        *backends
            .entry(key.dst_ip().unwrap().to_string())
            .or_insert(0) += 1;
    }
    assert_eq!(backends.len(), 4, "{backends:?}");
    assert!(
        backends.keys().all(|b| b.starts_with("198.18.200.")),
        "{backends:?}"
    );
}

/// `nat` over a file that carries both directions of every connection on its one port (as
/// `stateplane gen` writes them) keeps the flow hash on several workers: its steering by
/// the remote address reads the port, which a file does not mean as live ports do. Two
/// workers drop exactly what one drops (the answers to nothing translated).
#[test]
fn nat_over_one_file_drops_the_same_on_two_workers() {
    let input = tmp("nat-one-port.pcap");
    generate_trace("internet", 50_000, &input);
    let cfg = tmp("nat-one-port.toml");
    let mut drops = Vec::new();
    for workers in [1, 2] {
        std::fs::write(
            &cfg,
            format!(
                "workers = {workers}\n[program]\nname = \"nat\"\n[program.nat]\n\
                 external = \"198.18.255.1\"\nports = \"20000-65535\"\n\
                 [[port]]\nname = \"in\"\nrx = \"{}\"\ntx = \"/dev/null\"\n\
                 [[port]]\nname = \"out\"\ntx = \"/dev/null\"\n",
                input.display()
            ),
        )
        .unwrap();
        let text = ok(bin()
            .args(["run", "--json", "--config"])
            .arg(&cfg)
            .output()
            .unwrap());
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        drops.push(v["drops"].clone());
    }
    assert_eq!(drops[0], drops[1], "one worker, then two");
}

/// Over files, `sgw`'s packets are spread by subscriber as live ports spread them (the
/// same steering program), so each reaches the worker that holds its session: the
/// generated mobile workload (a third IPv6) comes out the same, packet for packet, on one
/// worker, two or three, and every packet comes out (answered, or tunneled either way).
#[test]
fn sgw_output_is_the_same_with_any_worker_count() {
    let input = tmp("sgw-workers-in.pcap");
    generate_with("gtp", 20_000, &input, &["--ipv6-share", "0.3"]);
    let cfg = tmp("sgw-workers.toml");
    std::fs::write(
        &cfg,
        format!(
            "[program]\nname = \"sgw\"\n[program.sgw]\naddress = \"198.19.255.2\"\n\
             ue_pool = \"198.18.128.0/17\"\nue_pool6 = \"2001:2:0:8000::/49\"\n\
             [[port]]\nname = \"access\"\nrx = \"{}\"\ntx = \"{}\"\n\
             [[port]]\nname = \"core\"\ntx = \"{}\"\n",
            input.display(),
            tmp("sgw-workers-access.pcap").display(),
            tmp("sgw-workers-core.pcap").display()
        ),
    )
    .unwrap();
    let written = [tmp("sgw-workers-access.pcap"), tmp("sgw-workers-core.pcap")];
    let outputs = outputs_by_workers(&cfg, &["1", "2", "3"], 20_000, &written);
    assert!(outputs[0][0].len() > 5_000 && outputs[0][1].len() > 5_000);
    assert!(outputs[1] == outputs[0], "two workers: the same output");
    assert!(outputs[2] == outputs[0], "three workers: the same output");
}

/// bench-cache keys a trace two ways: the 5-tuple, which leaves out fields that split a
/// connection into microflows (TCP flags), hits more often than the full key, and neither
/// beats its own bound (each microflow's first packet misses). An unknown key is refused.
#[test]
fn bench_cache_compares_the_full_key_with_the_5_tuple() {
    let csv = tmp("cache-keys.csv");
    let stdout = ok(bin()
        .args([
            "bench-cache",
            "--workloads",
            "internet",
            "--packets",
            "20000",
        ])
        .args(["--sizes", "65536", "--ways", "1", "--csv"])
        .arg(&csv)
        .output()
        .unwrap());
    let rate = |key: &str| -> f64 {
        let text = std::fs::read_to_string(&csv).unwrap();
        let row = (text.lines())
            .find(|l| l.starts_with(&format!("internet,{key},")))
            .unwrap_or_else(|| panic!("no {key} row in {text}"));
        row.rsplit(',').next().unwrap().parse().unwrap()
    };
    let bound = |key: &str| -> f64 {
        let line = (stdout.lines())
            .find(|l| l.starts_with(&format!("internet, {key} key:")))
            .unwrap_or_else(|| panic!("no {key} bound in {stdout}"));
        let best = line.split("at best ").nth(1).unwrap();
        best.split('%').next().unwrap().parse::<f64>().unwrap() / 100.0
    };
    let (full, tuple) = (rate("full"), rate("5-tuple"));
    assert!(full > 0.5 && tuple > full, "full {full}, 5-tuple {tuple}");
    assert!(full <= bound("full") + 5e-5, "{stdout}");
    assert!(tuple <= bound("5-tuple") + 5e-5, "{stdout}");

    refused(
        &["bench-cache", "--keys", "full,megaflow"],
        "--keys: 'megaflow' is not one of full, 5-tuple",
    );
}

/// `bench-flood` on a small table: with early drop, established connections keep every
/// packet through a SYN flood at 10x the table in each program; without it, the ones that
/// open during the flood lose theirs. Its CSV and SVG are written; bad flags are refused.
#[test]
fn bench_flood_serves_established_connections_through_a_flood() {
    let csv = tmp("flood.csv");
    let svg = tmp("flood.svg");
    ok(bin()
        .args([
            "bench-flood",
            "--capacity",
            "512",
            "--seconds",
            "40",
            "--csv",
        ])
        .arg(&csv)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap());
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 6, "three programs, early drop on and off");
    for row in &rows {
        let n = |name: &str| row[at(name)].parse::<u64>().unwrap();
        let served = n("established_served") as f64 / n("established_packets") as f64;
        assert!(n("entries") <= 512, "{row:?}");
        if row[at("early_drop")] == "true" {
            assert!(served >= 0.99, "{row:?}");
            assert!(n("early_dropped") > 0, "{row:?}");
        } else {
            assert!(served < 0.9, "{row:?}");
            assert!(n("refused_full") > 0, "{row:?}");
        }
    }
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    refused(&["bench-flood", "--flood", "udp"], "lb's VIP is TCP");
    refused(&["bench-flood", "--programs", "kv"], "'kv' is not one of");
}

/// A program that cannot work on several workers refuses to start on them, saying why and
/// the fix, instead of dropping or answering wrongly what reaches the wrong worker: `kv`
/// (state not synced between workers yet), `nat` with a port forward or under
/// endpoint-independent mapping, and the same inside a chain. One worker runs. (`sgw`
/// runs on several workers over files, which spread its packets as live ports do.)
#[test]
fn programs_that_need_one_worker_refuse_more() {
    let input = tmp("one-worker.pcap");
    generate_trace("internet", 100, &input);
    let cfg = tmp("one-worker.toml");
    let ports = format!(
        "[[port]]\nname = \"p0\"\nrx = \"{}\"\n[[port]]\nname = \"p1\"\ntx = \"/dev/null\"\n",
        input.display()
    );
    let nat = "[program]\nname = \"nat\"\n[program.nat]\nexternal = \"198.18.255.1\"\nports = \"20000-65535\"\nforwards = [{ proto = \"tcp\", port = 8080, to = \"198.18.0.5\" }]\n";
    let eim = "[program]\nname = \"nat\"\n[program.nat]\nexternal = \"198.18.255.1\"\nports = \"20000-65535\"\nmapping = \"endpoint_independent\"\n";
    let chain = "[program]\nname = \"chain\"\n[program.chain]\nstages = [\"acl\", \"nat\"]\n[program.chain.acl]\ndefault = \"permit\"\n[program.chain.nat]\nexternal = \"198.18.255.1\"\nmapping = \"endpoint_independent\"\n";
    let kv = "[program]\nname = \"kv\"\n[program.kv]\nserver = \"198.19.0.100\"\n";
    for (program, says) in [
        (kv, "kv runs on one worker"),
        (nat, "a forwarded port is fixed"),
        (eim, "endpoint-independent mapping"),
        (chain, "endpoint-independent mapping"),
    ] {
        std::fs::write(&cfg, format!("workers = 2\n{program}{ports}")).unwrap();
        let err = refused(&["run", "-c", &cfg.to_string_lossy()], says);
        assert!(err.contains("set workers = 1"), "{err}");
        std::fs::write(&cfg, format!("workers = 1\n{program}{ports}")).unwrap();
        ok(bin().args(["run", "-c"]).arg(&cfg).output().unwrap());
    }
}

/// `nat` on several workers over live ports spreads packets by the remote address, which
/// AF_XDP cannot: `io = "afxdp"` is refused before any interface is opened, naming the fix.
#[test]
fn nat_on_several_workers_refuses_afxdp_by_name() {
    let cfg = tmp("nat-afxdp.toml");
    std::fs::write(
        &cfg,
        "workers = 2\nio = \"afxdp\"\ncontrol = \"off\"\n[program]\nname = \"nat\"\n\
         [program.nat]\nexternal = \"198.18.255.1\"\ninside = \"a\"\noutside = \"b\"\n\
         [[port]]\nname = \"a\"\niface = \"nosuch0\"\n[[port]]\nname = \"b\"\niface = \"nosuch1\"\n",
    )
    .unwrap();
    let err = refused(
        &["run", "-c", &cfg.to_string_lossy()],
        "which AF_XDP cannot",
    );
    assert!(err.contains("io = \"afpacket\""), "{err}");
}

/// SIGINT during a run over a capture: what was read goes through the program and out,
/// the summary counts it, and the exit is 130 (it ended at once, without either).
#[test]
fn an_interrupted_run_writes_what_it_read_and_exits_130() {
    let trace = tmp("interrupted-run.pcap");
    generate_trace("internet", 200_000, &trace);
    let output = tmp("interrupted-run-out.pcap");
    let output_arg = output.to_string_lossy().to_string();
    let out = interrupted_mid_input(
        &["run", "forward", "--json", "-i", "-", "-o", &output_arg],
        &std::fs::read(&trace).unwrap(),
    );
    let summary: serde_json::Value =
        serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let sent = summary["counters"]["tx_packets"].as_u64().unwrap();
    assert!(sent > 0 && sent < 200_000, "stopped mid-way: {summary}");
    assert_eq!(summary["counters"]["rx_packets"], sent, "{summary}");
    assert_eq!(read_all(&output).unwrap().len() as u64, sent);
}

/// A configuration that sizes more memory than the run may take is refused before
/// anything is allocated, naming the setting, the total, the budget and the fix (it was
/// accepted, and the kernel killed the process after it had allocated 24 GB); the budget
/// is a setting, and what fits in it runs.
#[test]
fn sizes_past_the_memory_budget_are_refused_before_allocating() {
    let input = tmp("budget-in.pcap");
    generate_trace("internet", 1000, &input);
    let input = input.to_string_lossy().into_owned();
    let cfg = tmp("budget.toml");
    std::fs::write(
        &cfg,
        "workers = 64\n[program]\nname = \"conntrack\"\n[program.conntrack]\ncapacity = 67108864\n",
    )
    .unwrap();
    let cfg = cfg.to_string_lossy().into_owned();
    let started = std::time::Instant::now();
    let err = refused(
        &["run", "--config", &cfg, "-i", &input],
        "program.conntrack.capacity: 67108864 entries take",
    );
    assert!(
        err.contains("in each of 66 copies")
            && err.contains("past the memory budget of")
            && err.contains("raise --memory-budget (memory_budget)"),
        "{err}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "refused before allocating anything large"
    );
    // The same sizes under a budget given as a flag; and a budget that is no size.
    for (budget, message) in [
        ("1G", "past the memory budget of 953.7 MiB"),
        ("lots", "'lots' is not a number of bytes of at least 16M"),
    ] {
        let args = [
            "run",
            "--config",
            &cfg,
            "-i",
            &input,
            "--memory-budget",
            budget,
        ];
        refused(&args, message);
    }
    // Flow tables and sketches are claimed the same way.
    refused(
        &[
            "flows",
            "-i",
            &input,
            "--csv",
            "-",
            "--max-flows",
            "268435456",
            "--workers",
            "8",
        ],
        "--max-flows: flow tables of 268435456 flows for 8 workers take",
    );
    // Configurations whose sizes are past their budget, each refused naming its setting.
    let refused_config = |name: &str, text: &str, message: &str| {
        let path = tmp(name);
        std::fs::write(&path, text).unwrap();
        refused(
            &["run", "--config", &path.to_string_lossy(), "-i", &input],
            message,
        );
    };
    refused_config(
        "budget-hh.toml",
        "memory_budget = \"64M\"\n[program]\nname = \"hh\"\n[program.hh]\nwidth = 16777216\ndepth = 8\n",
        "program.hh.width: a sketch of 8 rows of 16777216 counters take 512.0 MiB",
    );
    // A rule pipeline's flow cache (it aborted allocating 32 GiB).
    refused_config(
        "budget-cache.toml",
        "memory_budget = \"64M\"\n[program]\nname = \"pipeline\"\n[program.pipeline]\ncache_entries = 268435456\ncache_ways = 4\nrules = [\"table=0,priority=1,actions=output:1\"]\n",
        "program.pipeline.cache_entries: a flow cache of 268435456 entries take 32.1 GiB",
    );
    // An ACL's counters and meters, one of each for every rule its capacity allows.
    refused_config(
        "budget-acl.toml",
        "workers = 64\nmemory_budget = \"1G\"\n[program]\nname = \"acl\"\n[program.acl]\ncapacity = 1048576\n",
        "program.acl.capacity: counters and meters of 1048576 rules take",
    );
    // An ACL's rule tables, shared by the workers, two versions at once.
    refused_config(
        "budget-acl-tables.toml",
        "memory_budget = \"650M\"\n[program]\nname = \"acl\"\n[program.acl]\ncapacity = 1048576\n",
        "program.acl.capacity: two versions of the rule tables of 1048576 rules take",
    );
    // A router's tables: two versions of a first level of 64 MiB.
    refused_config(
        "budget-router.toml",
        "memory_budget = \"100M\"\n[program]\nname = \"router\"\n",
        "program.router.routes: two versions of route tables with 0 IPv4 and 0 IPv6 prefixes take 128.0 MiB",
    );
    // The packets each worker may park for its replicated flows' writes.
    refused_config(
        "budget-parking.toml",
        "memory_budget = \"1G\"\n[program]\nname = \"counter\"\n[guarantees]\nflows = [\"replicated\"]\n[replication]\npark_limit = 16777216\n",
        "replication.park_limit: 16777216 parked packets and a replica's steady flows for each of 1 workers take",
    );
    // The bursts each worker's queues keep.
    refused_config(
        "budget-bursts.toml",
        "workers = 64\nburst = 1024\nqueue_depth = 1024\nmemory_budget = \"1G\"\n[program]\nname = \"forward\"\n",
        "queue_depth, burst: packet buffers of 2050 bursts of 1024 packets for each of 64 workers take",
    );
    // The sync stage's tables, one per worker.
    refused_config(
        "budget-sync.toml",
        "workers = 64\nmemory_budget = \"1G\"\n[program]\nname = \"hh\"\n[guarantees]\nsketch = [\"synced\"]\n[sync]\ncollector = \"127.0.0.1:9\"\nslots = 16777216\n",
        "sync.slots: sync tables of 16777216 slots for 64 workers take 32.0 GiB",
    );
    // The messages each worker's sync stage keeps for the collector's repairs.
    refused_config(
        "budget-sync-kept.toml",
        "workers = 8\nmemory_budget = \"20M\"\n[program]\nname = \"hh\"\n[program.hh]\ntenants = 1\nwidth = 64\ndepth = 1\n[guarantees]\nsketch = [\"synced\"]\n[sync]\ncollector = \"127.0.0.1:9\"\nslots = 1\n",
        "sync: the last 4096 messages each of 8 workers keeps to send again take 16.0 MiB",
    );
    // A live run's rings, claimed as each interface opens: AF_PACKET on loopback (MTU
    // 65536) has a 16 MiB receive ring, an 8 MiB socket buffer for large segments and
    // room to read one, and room to gather 64 frames of 64 KiB to send.
    let rings = tmp("budget-rings.toml");
    std::fs::write(
        &rings,
        "memory_budget = \"16M\"\nio = \"afpacket\"\ncontrol = \"off\"\n[program]\nname = \"forward\"\n[[port]]\nname = \"a\"\niface = \"lo\"\n",
    )
    .unwrap();
    refused(
        &["run", "--config", &rings.to_string_lossy()],
        "lo: rings for 1 worker(s) at MTU 65536 (a lower MTU makes them smaller) take 28.1 MiB",
    );
    // What fits runs.
    ok(bin()
        .args(["run", "conntrack", "-i", &input, "--memory-budget", "1G"])
        .output()
        .unwrap());
}

/// `gen` says how large a capture will be before it writes one above 100 MiB (within a
/// tenth of what it then writes), and refuses one the disk has no room for, saying both
/// sizes, before it creates the file.
#[test]
fn gen_says_the_size_before_writing_and_refuses_what_the_disk_cannot_hold() {
    let path = tmp("gen-size.pcap");
    let out = bin()
        .args(["gen", "internet", "--packets", "150000", "-o"])
        .arg(&path)
        .output()
        .unwrap();
    ok(out.clone());
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    let mib: f64 = (said.strip_prefix("writing about "))
        .and_then(|rest| rest.split(" MiB").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    let written = std::fs::metadata(&path).unwrap().len() as f64 / (1 << 20) as f64;
    assert!(
        (mib - written).abs() < written / 10.0,
        "said {mib} MiB, wrote {written}"
    );
    std::fs::remove_file(&path).unwrap();
    let huge = tmp("gen-huge.pcap");
    let args = ["gen", "internet", "--packets", "1000000000000", "-o"];
    let err = refused(
        &[&args[..], &[huge.to_str().unwrap()]].concat(),
        "--packets 1000000000000: the capture would take about ",
    );
    assert!(
        err.contains(" TiB, and ") && err.contains(" free; give fewer --packets"),
        "{err}"
    );
    assert!(!huge.exists(), "nothing written");
}

/// The summary says what each setting holds of the memory budget, in each copy and in
/// all, adding up to what the run claimed, and what the run held resident at its peak:
/// a conntrack table sized for 1,250,000 connections a worker is claimed whole in each of
/// its four copies (two workers, the factory's and the control plane's) and touched only where 11 packets
/// went. `flows` says the same of its flow tables.
#[test]
fn summaries_give_each_settings_share_of_the_memory_budget() {
    let input = tmp("shares-in.pcap");
    generate_trace("internet", 11, &input);
    let cfg = tmp("shares.toml");
    std::fs::write(
        &cfg,
        "workers = 2\n[program]\nname = \"conntrack\"\n[program.conntrack]\ncapacity = 1250000\n",
    )
    .unwrap();
    let run = |json: bool| {
        let mut run = bin();
        run.args(["run", "--config"])
            .arg(&cfg)
            .arg("-i")
            .arg(&input);
        if json {
            run.arg("--json");
        }
        ok(run.output().unwrap())
    };
    let summary: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    let memory = &summary["memory"];
    let shares = memory["by_setting"].as_array().unwrap();
    let table = (shares.iter())
        .find(|s| s["setting"] == "program.conntrack.capacity")
        .unwrap_or_else(|| panic!("{memory}"));
    let (each, copies) = (table["each"].as_u64().unwrap(), table["copies"].as_u64());
    // Two workers', the factory's and the control plane's.
    assert_eq!(copies, Some(4), "{memory}");
    assert_eq!(table["bytes"].as_u64(), Some(each * 4));
    assert!(
        each >= 1_250_000 * 64,
        "a slot holds at least its key: {memory}"
    );
    assert!(
        (shares.iter()).any(|s| s["setting"] == "queue_depth, burst"),
        "{memory}"
    );
    let sum: u64 = shares.iter().map(|s| s["bytes"].as_u64().unwrap()).sum();
    assert_eq!(memory["claimed_bytes"].as_u64(), Some(sum));
    assert!(memory["budget_bytes"].as_u64() > Some(sum));
    let peak = memory["resident_peak_bytes"].as_u64().unwrap();
    assert!(peak > 0 && peak < each, "touched by need: {memory}");
    let text = run(false);
    assert!(
        (text.lines()).any(|l| l.contains("program.conntrack.capacity") && l.contains("(4 x ")),
        "{text}"
    );
    assert!(text.contains("resident at peak"), "{text}");
    // The flow monitor's flow tables, every worker's, claimed once.
    let args = ["flows", "--csv", "-", "--summary-json", "--workers", "2"];
    let flows = bin().args(args).arg("-i").arg(&input).output().unwrap();
    let stderr = String::from_utf8_lossy(&flows.stderr).into_owned();
    let summary: serde_json::Value = (stderr.lines().rev())
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    let memory = &summary["memory"];
    let shares = memory["by_setting"].as_array().unwrap();
    assert_eq!(shares.len(), 1, "{memory}");
    assert_eq!(shares[0]["setting"], "--max-flows");
    assert_eq!(memory["claimed_bytes"], shares[0]["bytes"]);
}

/// What tshark reads of each frame of `file` that `filter` keeps: the `fields`, in order.
fn tshark_fields(file: &Path, filter: &str, fields: &[&str]) -> Vec<Vec<String>> {
    let mut tshark = tool("tshark");
    tshark.args(["-n", "-r"]).arg(file);
    tshark.args(["-Y", filter, "-T", "fields", "-E", "separator=;"]);
    for field in fields {
        tshark.args(["-e", field]);
    }
    let out = ok(tshark.output().unwrap());
    let line = |l: &str| l.split(';').map(str::to_owned).collect();
    out.lines().map(line).collect()
}

/// `sgw` answers the MME's signaling in the data plane, and tshark reads the answers as
/// the GTPv2-C an MME expects: for each request of the generator's `gtp` workload one
/// response, of the request's type plus one, to the MME's TEID (its Sender F-TEID's in a
/// Create Session Request), with its sequence number and cause "Request accepted" (16);
/// each Create Session Response with the gateway's S11 (interface type 11) and S1-U (1)
/// F-TEIDs, which carry the subscriber's place in the pool, the bearer's id and the
/// address at that place, and for a subscriber that asked for IPv4v6 the /64 at that place
/// too; no frame malformed.
#[test]
fn tshark_reads_sgws_signaling_responses_as_gtpv2() {
    let trace = tmp("sgw-signaling.pcap");
    generate_trace("gtp", 4000, &trace);
    let (config, access) = (tmp("sgw-signaling.toml"), tmp("sgw-signaling-access.pcap"));
    std::fs::write(
        &config,
        format!(
            "workers = 1\n[program]\nname = \"sgw\"\n[program.sgw]\naddress = \"198.19.255.2\"\n\
             ue_pool = \"198.18.128.0/17\"\nue_pool6 = \"2001:2:0:8000::/49\"\n\
             [[port]]\nname = \"access\"\nrx = \"{}\"\ntx = \"{}\"\n\
             [[port]]\nname = \"core\"\ntx = \"{}\"\n",
            trace.display(),
            access.display(),
            tmp("sgw-signaling-core.pcap").display()
        ),
    )
    .unwrap();
    ok(bin().args(["run", "-c"]).arg(&config).output().unwrap());
    let gtpv2 = |file: &Path| {
        let fields = [
            "gtpv2.message_type",
            "gtpv2.seq",
            "gtpv2.cause",
            "gtpv2.f_teid_interface_type",
            "gtpv2.f_teid_gre_key",
            "gtpv2.ebi",
            "gtpv2.pdn_addr_and_prefix.ipv4",
            "_ws.malformed",
            "ip.dst",
            "gtpv2.teid",
            "gtpv2.pdn_type",
            "gtpv2.pdn_addr_and_prefix.ipv6",
        ];
        tshark_fields(file, "gtpv2", &fields)
    };
    // Every frame out is whole: its length on the wire is the bytes written (a tunnel's
    // headers added, taken away, a response in place of a request).
    for out in [&access, &tmp("sgw-signaling-core.pcap")] {
        let cut = tshark_fields(out, "frame.len != frame.cap_len", &["frame.number"]);
        let first = cut.first();
        assert!(
            cut.is_empty(),
            "{} frames marked as cut short, the first {first:?}",
            cut.len()
        );
    }
    let requests = gtpv2(&trace);
    let mut v4v6 = 0;
    let responses = gtpv2(&access);
    assert!(requests.len() > 100, "{} requests", requests.len());
    assert_eq!(responses.len(), requests.len(), "one response a request");
    for (request, response) in requests.iter().zip(&responses) {
        let kind: u8 = request[0].parse().unwrap();
        assert_eq!(response[0], (kind + 1).to_string(), "{response:?}");
        assert_eq!(response[1], request[1], "sequence: {response:?}");
        assert_eq!(response[7], "", "malformed: {response:?}");
        assert_eq!(response[8], "198.18.255.1", "to the MME: {response:?}");
        let hex = |t: &str| u32::from_str_radix(t.trim_start_matches("0x"), 16).unwrap();
        // The MME's TEID: a Create's Sender F-TEID (its first), else the one the
        // generator's MME takes for the subscriber whose place the request's TEID carries.
        let mme = match kind {
            32 => hex(request[4].split(',').next().unwrap()),
            _ => 0x4000_0000 | (hex(&request[9]) & 0x0fff_ffff),
        };
        assert_eq!(hex(&response[9]), mme, "the MME's TEID: {response:?}");
        if kind != 32 {
            assert_eq!(response[2], "16", "{response:?}");
            continue;
        }
        // Create Session Response: the cause twice (message, bearer), the F-TEIDs of
        // S11 then S1-U, subscriber n's TEIDs, its address in the pool.
        assert_eq!(response[2], "16,16", "{response:?}");
        assert_eq!(response[3], "11,1", "{response:?}");
        let teids: Vec<u32> = response[4].split(',').map(hex).collect();
        let n = teids[0] & 0x0fff_ffff;
        assert_eq!(teids, [0x1000_0000 | n, 0x2000_0000 | n], "{response:?}");
        assert_eq!(response[5], "5", "{response:?}");
        let ue: std::net::Ipv4Addr = response[6].parse().unwrap();
        assert_eq!(u32::from(ue), u32::from_be_bytes([198, 18, 128, 0]) + n);
        // A subscriber asking for IPv4v6 (3, as the generator's IPv6 share do) gets the
        // /64 at its place too.
        assert_eq!(
            response[10], request[10],
            "the PDN type asked: {response:?}"
        );
        if response[10] == "3" {
            let prefix: std::net::Ipv6Addr = response[11].parse().unwrap();
            let expected = (0x2001_0002_0000_8000u128 + u128::from(n)) << 64;
            assert_eq!(u128::from(prefix), expected, "{response:?}");
            v4v6 += 1;
        }
    }
    assert!(v4v6 > 5, "{v4v6} IPv4v6 sessions");
}

/// What `sgw` refuses it answers with the cause, and tshark reads those answers too: in
/// the `gtp` workload, the first Create Session Request's IMSI hidden (its element's type
/// changed to one the gateway does not read) is answered "Mandatory IE missing" (70)
/// naming the IMSI (type 1), to the MME's TEID; a Modify Bearer Request to a TEID of no
/// session "Context not found" (64), to TEID 0; an Echo Request gets an Echo Response
/// with its restart counter, on GTP-C and on GTP-U; the refused subscriber's uplink gets
/// an Error Indication; no frame malformed.
#[test]
fn tshark_reads_sgws_refusals_and_echo_responses() {
    let trace = tmp("sgw-refusals.pcap");
    let gtp = 14 + 20 + 8;
    generate_broken("gtp", 2000, &trace, |frames| {
        let signal =
            |f: &[u8], kind: u8| f.len() > gtp + 16 && f[42] >> 5 == 2 && f[gtp + 1] == kind;
        let create = frames.iter().position(|(_, f, _)| signal(f, 32)).unwrap();
        frames[create].1[gtp + 12] = 200;
        let modify = frames.iter().position(|(_, f, _)| signal(f, 34)).unwrap();
        frames[modify].1[gtp + 4..gtp + 8].copy_from_slice(&0x1000_7530u32.to_be_bytes());
        // An Echo Request: no TEID, sequence 0x77, the Recovery element.
        let echo = [0x40, 1, 0, 9, 0, 0, 0x77, 0, 3, 0, 1, 0, 5];
        let (mut client, _) = common::client_and_server();
        client.src = std::net::Ipv4Addr::new(198, 18, 255, 1).into();
        client.dst = std::net::Ipv4Addr::new(198, 19, 255, 2).into();
        let l4 = stateplane_gen::build::L4::Udp {
            src_port: 2123,
            dst_port: 2123,
        };
        let mut frame = Vec::new();
        stateplane_gen::build::emit_frame(&mut frame, &client, &l4, &echo);
        let (ts, _, _) = frames[modify];
        frames.insert(modify + 1, (ts, frame.clone(), frame.len() as u32));
        // A GTP-U Echo Request from an eNodeB: sequence 0x99.
        let echo_u = [0x32, 1, 0, 4, 0, 0, 0, 0, 0, 0x99, 0, 0];
        client.src = std::net::Ipv4Addr::new(198, 18, 200, 1).into();
        let l4 = stateplane_gen::build::L4::Udp {
            src_port: 2152,
            dst_port: 2152,
        };
        stateplane_gen::build::emit_frame(&mut frame, &client, &l4, &echo_u);
        frames.insert(modify + 2, (ts, frame.clone(), frame.len() as u32));
    });
    let (config, access) = (tmp("sgw-refusals.toml"), tmp("sgw-refusals-access.pcap"));
    std::fs::write(
        &config,
        format!(
            "workers = 1\n[program]\nname = \"sgw\"\n[program.sgw]\naddress = \"198.19.255.2\"\n\
             ue_pool = \"198.18.128.0/17\"\n\
             [[port]]\nname = \"access\"\nrx = \"{}\"\ntx = \"{}\"\n\
             [[port]]\nname = \"core\"\ntx = \"{}\"\n",
            trace.display(),
            access.display(),
            tmp("sgw-refusals-core.pcap").display()
        ),
    )
    .unwrap();
    ok(bin().args(["run", "-c"]).arg(&config).output().unwrap());
    let fields = [
        "gtpv2.message_type",
        "gtpv2.seq",
        "gtpv2.cause",
        "gtpv2.cause_off_ie_t",
        "gtpv2.teid",
        "gtpv2.rec",
        "_ws.malformed",
    ];
    let responses = tshark_fields(&access, "gtpv2", &fields);
    assert!(responses.iter().all(|r| r[6].is_empty()), "none malformed");
    let first = |kind: &str, cause: &str| {
        (responses.iter())
            .find(|r| r[0] == kind && r[2] == cause)
            .unwrap_or_else(|| panic!("no response {kind} with cause {cause}: {responses:?}"))
    };
    let missing = first("33", "70");
    assert_eq!(missing[3], "1", "the IMSI named: {missing:?}");
    assert!(
        missing[4].starts_with("0x4"),
        "to the MME's TEID: {missing:?}"
    );
    let not_found = first("35", "64");
    assert_eq!(not_found[4], "0x00000000", "to TEID 0: {not_found:?}");
    let echo = (responses.iter())
        .find(|r| r[0] == "2")
        .expect("an Echo Response");
    assert_eq!(
        (echo[1].as_str(), echo[4].as_str(), echo[5].as_str()),
        ("0x000077", "", "0"),
        "{echo:?}"
    );
    let fields = [
        "gtp.teid",
        "gtp.seq_number",
        "gtp.recovery",
        "_ws.malformed",
        "udp.srcport",
        "ip.dst",
    ];
    assert_eq!(
        tshark_fields(&access, "gtp.message == 2", &fields),
        [["0x00000000", "0x0099", "0", "", "2152", "198.18.200.1"]],
        "one GTP-U Echo Response, to the eNodeB"
    );
    // The users' packets of the subscriber whose Create was refused name no session: the
    // first gets an Error Indication back to its eNodeB, with the TEID it carried.
    let fields = [
        "gtp.teid",
        "gtp.teid_data",
        "_ws.malformed",
        "ip.src",
        "ip.dst",
    ];
    let indications = tshark_fields(&access, "gtp.message == 26", &fields);
    assert!(!indications.is_empty(), "an Error Indication");
    for e in &indications {
        assert_eq!(
            (e[0].as_str(), e[2].as_str(), e[3].as_str()),
            ("0x00000000", "", "198.19.255.2"),
            "{e:?}"
        );
        assert!(
            e[1].starts_with("0x2") && e[4].starts_with("198.18.200."),
            "{e:?}"
        );
    }
}

/// Every `stateplane` command the README and docs/ show (their code lines) names a command
/// that exists and only options that command has: the docs are run as written, and a
/// renamed flag must not leave them behind.
#[test]
fn every_command_in_the_docs_names_real_commands_and_options() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut helps = std::collections::HashMap::new();
    let (mut checked, mut wrong) = (0, Vec::new());
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let mut fenced = false;
        for (n, line) in text.lines().enumerate() {
            if line.starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if !(fenced || line.starts_with("    ")) {
                continue;
            }
            let code = line.split(" #").next().unwrap_or_default();
            let words: Vec<&str> = code.split_whitespace().collect();
            // Each `stateplane` on the line starts a command (`lab exec ... stateplane ctl`).
            let starts = (words.iter().enumerate())
                .filter(|(_, w)| **w == "stateplane" || w.ends_with("/stateplane"))
                .map(|(i, _)| i);
            for start in starts {
                let args: Vec<&str> = (words[start + 1..].iter())
                    .take_while(|w| {
                        !["|", ">", "2>", "<", "&&", ";", "&", "--", "\\"].contains(w)
                            && **w != "stateplane"
                    })
                    .copied()
                    .collect();
                if args.is_empty() {
                    continue;
                }
                checked += 1;
                if let Err(why) = check_command(&args, &mut helps) {
                    let name = file.file_name().unwrap().to_string_lossy();
                    wrong.push(format!("{name}:{}: {}: {why}", n + 1, code.trim()));
                }
            }
        }
    }
    assert!(checked > 100, "{checked} commands found in the docs");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Checks one command's words against `stateplane ... --help`: its commands and
/// subcommands, and each option it gives (skipping their values).
fn check_command(
    args: &[&str],
    helps: &mut std::collections::HashMap<Vec<String>, Option<String>>,
) -> Result<(), String> {
    let mut help_of = |path: &[String]| -> Option<String> {
        (helps.entry(path.to_vec()))
            .or_insert_with(|| {
                let out = bin().args(path).arg("--help").output().unwrap();
                out.status
                    .success()
                    .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
            })
            .clone()
    };
    let mut path = vec![args[0].to_string()];
    let mut help = help_of(&path).ok_or(format!("no command {}", args[0]))?;
    let mut positionals = 0;
    let mut words = args[1..].iter();
    while let Some(word) = words.next() {
        if word.starts_with('-') && word.len() > 1 {
            let flag = word.split('=').next().unwrap_or(word);
            // An option's line in the help: `-s, --server <ENDPOINT>  what it does`.
            let spec = help.lines().find_map(|l| {
                let head: Vec<&str> = (l.split_whitespace())
                    .take_while(|w| w.starts_with('-') || w.starts_with('<'))
                    .collect();
                let names = head.iter().map(|w| w.trim_end_matches(','));
                names.clone().any(|n| n == flag).then_some(head)
            });
            let Some(spec) = spec else {
                return Err(format!(
                    "`stateplane {}` has no option {flag}",
                    path.join(" ")
                ));
            };
            let takes_value = spec.iter().any(|w| w.starts_with('<'));
            if takes_value && !word.contains('=') {
                words.next();
            }
            continue;
        }
        let commands: Vec<&str> = (help.split_once("\nCommands:\n"))
            .map(|(_, rest)| {
                (rest.lines())
                    .take_while(|l| l.starts_with("  "))
                    .filter_map(|l| l.split_whitespace().next())
                    .collect()
            })
            .unwrap_or_default();
        if !commands.is_empty() && positionals == 0 {
            if !commands.contains(word) {
                return Err(format!(
                    "`stateplane {}` has no command {word}",
                    path.join(" ")
                ));
            }
            path.push(word.to_string());
            help = help_of(&path).ok_or(format!("no command {}", path.join(" ")))?;
            continue;
        }
        positionals += 1;
        // The arguments of a command that takes another as its last (`lab exec TOPOLOGY
        // NODE COMMAND...`) are that command's.
        let usage = help.lines().find(|l| l.starts_with("Usage:")).unwrap_or("");
        if usage.ends_with("...") && positionals >= usage.matches('<').count() {
            break;
        }
    }
    Ok(())
}

/// `stateplane report` gathers a folder's results into one page that a real browser
/// (headless Chromium) draws: the page's own checks pass, each run, table and chart has
/// its section, and a screenshot is taken. A chart that draws nothing fails the page's
/// checks, so they are no formality.
#[test]
fn report_gathers_runs_tables_and_charts_into_a_page_a_browser_checks() {
    let dir = common::tmp_dir("report");
    let trace = dir.join("in.pcap");
    generate_trace("internet", 20_000, &trace);
    for program in ["forward", "conntrack"] {
        let summary = dir.join(format!("{program}.summary.json"));
        ok(bin()
            .args(["run", program, "-i"])
            .arg(&trace)
            .arg("--summary-file")
            .arg(&summary)
            .output()
            .unwrap());
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
        assert_eq!(written["counters"]["rx_packets"], 20_000, "{written}");
    }
    ok(bin()
        .args(["flows", "-i"])
        .arg(&trace)
        .arg("--csv")
        .arg(dir.join("flows.csv"))
        .output()
        .unwrap());
    std::fs::write(
        dir.join("rates.csv"),
        "run,kind,Mpps\nfiles,forward,2\nfiles,nat,1\n",
    )
    .unwrap();
    ok(bin()
        .args(["chart", "--from"])
        .arg(dir.join("rates.csv"))
        .arg("--svg")
        .arg(dir.join("rates.svg"))
        .output()
        .unwrap());
    let said = ok(bin().arg("report").arg(&dir).output().unwrap());
    assert!(
        said.contains(
            "7 sections (2 run summaries, 2 tables, 2 charts; 1 other file or folder named)"
        ),
        "{said}"
    );
    let page = dir.join("report.html");
    let dom = browse(&page, &["--dump-dom"]);
    assert!(dom.contains("data-checks=\"passed\""), "{dom}");
    for section in [
        "<h2>The runs side by side</h2>",
        "<h2>forward (forward.summary.json)</h2>",
        "<h2>conntrack (conntrack.summary.json)</h2>",
        "<h2>flows.csv</h2>",
        "<h2>rates.svg</h2>",
        "<td>in.pcap</td>",
        // A summary's counts grouped, its ports' too.
        "<td>packets in</td><td>20,000</td>",
        "<td>in0</td><td>0</td><td>0</td>",
        "The first 20 of its ",
    ] {
        assert!(dom.contains(section), "{section}: {dom}");
    }
    let shot = dir.join("report.png");
    browse(
        &page,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1100,1800",
        ],
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG screenshot");
    assert!(
        png.len() > 20_000,
        "a page with content, not a blank one: {} bytes",
        png.len()
    );

    // A CSV with no rows, and an empty one, are said to be so; the page passes its checks.
    std::fs::write(dir.join("no-rows.csv"), "src,dst,packets\n").unwrap();
    std::fs::write(dir.join("nothing.csv"), "").unwrap();
    ok(bin().arg("report").arg(&dir).output().unwrap());
    let dom = browse(&page, &["--dump-dom"]);
    assert!(dom.contains("data-checks=\"passed\""), "{dom}");
    assert!(
        dom.contains("A header and no rows: src, dst, packets."),
        "{dom}"
    );
    assert!(dom.contains("An empty file."), "{dom}");
    refused(
        &["report", dir.to_str().unwrap(), "--rows", "0"],
        "--rows 0",
    );

    // A chart that draws nothing: the page says so.
    std::fs::write(
        dir.join("empty.svg"),
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"10\" height=\"10\"></svg>",
    )
    .unwrap();
    ok(bin().arg("report").arg(&dir).output().unwrap());
    let dom = browse(&page, &["--dump-dom"]);
    assert!(dom.contains("data-checks=\"failed\""), "{dom}");
    assert!(dom.contains("a chart drew nothing"), "{dom}");
    // Nothing to gather, and no folder: said, with what to give.
    let empty = common::tmp_dir("report-empty");
    let e = refused(&["report", empty.to_str().unwrap()], "no results to gather");
    assert!(e.contains("run --summary-file"), "{e}");
    refused(
        &["report", "/nonexistent-folder"],
        "give the folder of results",
    );
}

/// A run that cannot start (an interface that is not there) writes no summary: the file
/// beside the one `--summary-file` names is only tried before the run (made and removed),
/// so that nothing takes an empty file for a run's summary; a file that was there keeps
/// what it held, and a run that does run replaces it whole.
#[test]
fn a_run_that_cannot_start_leaves_no_summary_file() {
    let summary = tmp("never-ran.json");
    let _ = std::fs::remove_file(&summary);
    let path = summary.to_str().unwrap();
    let cannot_start = ["run", "forward", "-I", "nosuchif0", "--summary-file", path];
    refused(&cannot_start, "there is no interface 'nosuchif0'");
    assert!(!summary.exists(), "{path} is left behind");
    let partial = summary.with_file_name(".never-ran.json.partial");
    assert!(!partial.exists(), "{} is left behind", partial.display());
    let earlier = "{\"an earlier run's summary\": true, \"padding\": \"longer than a summary of a run of nothing, longer still, and longer\"}";
    let earlier = earlier.repeat(400);
    std::fs::write(&summary, &earlier).unwrap();
    refused(&cannot_start, "there is no interface 'nosuchif0'");
    assert_eq!(std::fs::read_to_string(&summary).unwrap(), earlier);
    // A run that runs replaces it whole (a shorter summary leaves none of it behind).
    let input = tmp("never-ran-in.pcap");
    generate_with("internet", 100, &input, &[]);
    ok(bin()
        .args(["run", "forward", "--workers", "1", "-i"])
        .arg(&input)
        .args(["--summary-file", path])
        .output()
        .unwrap());
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(written["counters"]["rx_packets"], 100, "{written}");
    assert!(!partial.exists(), "{} is left behind", partial.display());
    // A folder that cannot be written is refused before the run, naming the flag and
    // the fix: the switch ends while its input has not (its standard input held open).
    let (mut run, stdin) = reading_held_open(
        &[
            "run",
            "forward",
            "-i",
            "-",
            "--summary-file",
            "/nonexistent-folder/s.json",
        ],
        &input,
    );
    let ended = (0..200).find_map(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        run.try_wait().unwrap()
    });
    let _ = run.kill();
    let out = run.wait_with_output().unwrap();
    drop(stdin);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(ended.is_some_and(|s| !s.success()), "{ended:?} {err}");
    assert!(
        err.contains("--summary-file /nonexistent-folder/s.json: No such file")
            && err.contains("give a path in a folder this user can write"),
        "{err}"
    );
}

/// `stateplane ARGS` reading `input` on its standard input, whose end is held back: the run
/// reads on until the returned handle is dropped (its standard error piped, its output
/// thrown away).
fn reading_held_open(
    args: &[&str],
    input: &Path,
) -> (std::process::Child, std::process::ChildStdin) {
    use std::io::Write;
    use std::process::Stdio;
    let mut run = (bin().args(args))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = run.stdin.take().unwrap();
    stdin.write_all(&std::fs::read(input).unwrap()).unwrap();
    (run, stdin)
}

/// A run killed while it runs (SIGKILL: no summary can be written) leaves nothing beside
/// the path `--summary-file` names: the file beside it exists only while a summary is
/// written, at the end.
#[test]
fn a_run_killed_while_it_runs_leaves_no_partial_summary() {
    let summary = tmp("killed.json");
    let partial = summary.with_file_name(".killed.json.partial");
    let _ = std::fs::remove_file(&summary);
    let _ = std::fs::remove_file(&partial);
    let input = tmp("killed-in.pcap");
    generate_with("internet", 100, &input, &[]);
    let port = common::free_port();
    let metrics = format!("127.0.0.1:{port}");
    let summary_arg = summary.to_str().unwrap();
    let (mut run, stdin) = reading_held_open(
        &[
            "run",
            "forward",
            "--workers",
            "1",
            "-i",
            "-",
            "--metrics",
            &metrics,
            "--summary-file",
            summary_arg,
        ],
        &input,
    );
    // Its metrics come up as it is built; the summary's folder is tried just after.
    let up = common::scrape_until(port, |b| b.starts_with("HTTP/1.0 200 OK"));
    assert!(up.starts_with("HTTP/1.0 200 OK"), "no metrics: {up}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(run.try_wait().unwrap(), None, "it ended before the kill");
    run.kill().unwrap();
    run.wait().unwrap();
    drop(stdin);
    assert!(!partial.exists(), "{} is left behind", partial.display());
    assert!(!summary.exists(), "{} was written", summary.display());
    std::fs::remove_file(&input).unwrap();
}

/// What headless Chromium makes of `page` with `args` (the DOM after the page's scripts ran,
/// or a screenshot).
fn browse(page: &Path, args: &[&str]) -> String {
    let out = tool("chromium-headless-shell")
        .args(["--no-sandbox", "--disable-gpu", "--hide-scrollbars"])
        .arg("--virtual-time-budget=5000")
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// docs/BENCHMARKS.md shows the present: each of its sections gives the command behind its
/// figures (a code line), the date they were measured and the commit measured, a commit
/// this repository has (where the clone holds its history), and no section tells the runs
/// before it (history lives in git).
#[test]
fn every_benchmark_section_gives_its_command_date_and_commit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("docs/BENCHMARKS.md")).unwrap();
    let shallow = std::process::Command::new("git")
        .args(["rev-parse", "--is-shallow-repository"])
        .current_dir(&root)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() != "false")
        .unwrap_or(true);
    let is_commit = |word: &str| {
        word.len() >= 7
            && word.len() <= 12
            && word
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            && word.chars().any(|c| c.is_ascii_alphabetic())
    };
    let known = |hash: &str| {
        shallow
            || std::process::Command::new("git")
                .args(["cat-file", "-e", &format!("{hash}^{{commit}}")])
                .current_dir(&root)
                .status()
                .is_ok_and(|s| s.success())
    };
    let mut wrong = Vec::new();
    let sections: Vec<&str> = text.split("\n## ").skip(1).collect();
    assert!(sections.len() > 20, "{} sections", sections.len());
    for section in &sections {
        let title = section.lines().next().unwrap_or_default();
        let words = section.split(|c: char| !c.is_ascii_alphanumeric());
        let commits: Vec<&str> = words.filter(|w| is_commit(w)).collect();
        if !commits.iter().any(|c| known(c)) {
            wrong.push(format!("{title}: no commit of this repository"));
        }
        let dated = (section
            .match_indices("2026-")
            .chain(section.match_indices("2027-")))
        .any(|(i, _)| {
            section[i + 5..]
                .chars()
                .take(5)
                .filter(char::is_ascii_digit)
                .count()
                == 4
        });
        if !dated {
            wrong.push(format!("{title}: no date"));
        }
        let command = (section.lines()).any(|l| l.starts_with("    ") && !l.trim().is_empty())
            || section.contains("`stateplane ")
            || section.contains("scripts/");
        if !command {
            wrong.push(format!("{title}: no command"));
        }
        for diary in [
            "The run before it",
            "Earlier runs of the same",
            "for comparison:",
        ] {
            if section.contains(diary) {
                wrong.push(format!("{title}: tells earlier runs (\"{diary}\")"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A run with a `[flows]` section serves its exporter's counts: the records it took and,
/// by sink, the messages, bytes, records and losses; at the end every sink's records are
/// the CSV's rows, and the dashboard's flow panels query families it serves.
#[test]
fn metrics_count_the_flow_records_a_run_exports() {
    let dir = common::tmp_dir("flow-metrics");
    generate_trace("internet", 5000, &dir.join("in.pcap"));
    let config = dir.join("flows.toml");
    std::fs::write(
        &config,
        "[program]\nname = \"forward\"\n[[port]]\nname = \"in\"\nrx = \"in.pcap\"\n\
         [flows]\ncsv = \"flows.csv\"\nipfix_file = [\"flows.ipfix\"]\n",
    )
    .unwrap();
    let port = 20_000 + ((std::process::id() + 7_919) % 20_000) as u16;
    let mut run = bin();
    run.args(["run", "--hold-metrics", "20", "--metrics"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--config")
        .arg(&config);
    let rows = || {
        std::fs::read_to_string(dir.join("flows.csv"))
            .map_or(0, |t| t.lines().count().saturating_sub(1) as u64)
    };
    let by_sink = |text: &str, family: &str| -> Vec<u64> {
        let prefix = format!("{family}{{sink=\"");
        (text.lines())
            .filter(|l| l.starts_with(&prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect()
    };
    // Until the exporter has published its end.
    let ended = |text: &str| {
        let taken = sum_of(text, "stateplane_flow_records_total");
        let sinks = by_sink(text, "stateplane_flow_export_records_total");
        taken > 0 && sinks.len() == 2 && sinks.iter().all(|&n| n == taken) && rows() == taken
    };
    let text = &common::metrics_of_held_run(&mut run, port, ended);
    let taken = sum_of(text, "stateplane_flow_records_total");
    assert!(taken > 100, "{text}");
    assert_eq!(
        rows(),
        taken,
        "the CSV's rows are the records taken: {text}"
    );
    assert_eq!(
        by_sink(text, "stateplane_flow_export_records_total"),
        vec![taken, taken],
        "{text}"
    );
    assert_eq!(
        sum_of(text, "stateplane_flow_records_dropped_total"),
        0,
        "{text}"
    );
    assert_eq!(
        sum_of(text, "stateplane_flow_export_lost_messages_total"),
        0,
        "{text}"
    );
    // The CSV's lines are its messages: a header and a line a record.
    assert!(
        by_sink(text, "stateplane_flow_export_messages_total").contains(&(taken + 1)),
        "{text}"
    );
    common::assert_scrape_sound(text, |f| f.starts_with("stateplane_flow"));
}

/// `ctl`'s own arguments are checked before it reaches for the switch, so that a wrong one
/// is told as such (here no switch listens), and a timeout that is no length of time is
/// refused where it used to panic.
#[test]
fn ctl_arguments_are_checked_before_the_switch_is_reached() {
    let server = format!("127.0.0.1:{}", common::free_port());
    let missing = tmp("ctl-args").join("missing.rules");
    let missing = missing.to_str().unwrap();
    let cases: [(&[&str], &str); 8] = [
        (&["register", "sketch", "5..3"], "the range 5..3 is empty"),
        (
            &["watch", "--timeout=nan"],
            "--timeout: NaN is not a time to wait",
        ),
        (
            &["insert", "connections"],
            "give an entry (FIELD=VALUE ... ACTION PARAM=VALUE) or --file",
        ),
        (&["insert", "connections", "--file", missing], "cannot read"),
        (&["add-flows", missing], "cannot read"),
        (
            &["meter", "rule_meters", "--srtcm", "1,2"],
            "--srtcm takes three numbers",
        ),
        (&["dump-flows", "table=x"], "'x' is not a number"),
        (
            &["register", "sketch", "0..4"],
            "cannot reach the control API",
        ),
    ];
    for (args, message) in cases {
        let err = refused(&[&["ctl", "--server", &server], args].concat(), message);
        if !message.starts_with("cannot reach") {
            assert!(!err.contains("cannot reach"), "{args:?}: {err}");
        }
    }
}

/// `gen --established-passes` writes the trace again and again as the same connections,
/// open throughout: a firewall (which checks each segment against its connection's
/// windows) forwards every packet of every pass, where the second pass's segments written
/// with their sequence numbers as they were are mostly out of window.
#[test]
fn gen_writes_passes_of_established_flows_that_a_firewall_forwards_whole() {
    let passes = tmp("established-passes.pcap");
    let text = ok(bin()
        .args([
            "gen",
            "datacenter",
            "--packets",
            "20000",
            "--flows",
            "100",
            "--seed",
            "7",
        ])
        .args(["--established-passes", "3", "--json", "-o"])
        .arg(&passes)
        .output()
        .unwrap());
    let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
    let packets = summary["packets"].as_u64().unwrap();
    let (first, later) = (
        summary["first_pass_packets"].as_u64().unwrap(),
        summary["later_pass_packets"].as_u64().unwrap(),
    );
    assert_eq!(packets, first + 2 * later);
    assert!(later > 19_000 && later < first, "{text}");
    let run = |input: &Path| {
        let out = ok(bin()
            .args(["run", "firewall", "--json", "-i"])
            .arg(input)
            .output()
            .unwrap());
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let counters = &v["counters"];
        (
            counters["rx_packets"].as_u64().unwrap(),
            counters["tx_packets"].as_u64().unwrap(),
        )
    };
    assert_eq!(run(&passes), (packets, packets));
    // The control: the same first pass, then the trace's segments with no SYN, FIN or
    // RST again as they are, their sequence numbers behind the windows the first left.
    let once = tmp("established-once.pcap");
    generate_with("datacenter", 20_000, &once, &["--flows", "100"]);
    let hasher = stateplane_wire::FlowHasher::with_seed(1);
    let opens_or_closes = |data: &[u8]| {
        use stateplane_wire::tcp::flags;
        let parsed = stateplane_wire::parse(data, 0, &hasher).unwrap();
        parsed.tcp_flags & (flags::SYN | flags::FIN | flags::RST) != 0
    };
    let records = read_all(&once).unwrap();
    let written = read_all(&passes).unwrap();
    assert_eq!(written.len() as u64, packets);
    let shift = records.last().unwrap().0 - records[0].0 + 1_000_000;
    let again = (records.iter())
        .filter(|(_, data, _)| !opens_or_closes(data))
        .map(|(ts, data, len)| (ts + shift, data.clone(), *len));
    let both: Vec<_> = written[..first as usize]
        .iter()
        .cloned()
        .chain(again)
        .collect();
    let twice = tmp("established-twice.pcap");
    write_capture(&twice, &both, stateplane_io::CaptureFormat::PcapNano);
    let (rx, tx) = run(&twice);
    assert_eq!(rx, first + later);
    assert!(tx < first + later / 2, "{tx} of {rx} forwarded");
    refused(
        &[
            "gen",
            "datacenter",
            "--established-passes",
            "0",
            "-o",
            "x.pcap",
        ],
        "--established-passes 0: give 1 to 100 passes of the trace",
    );
    refused(
        &[
            "gen",
            "datacenter",
            "--established-passes",
            "101",
            "-o",
            "x.pcap",
        ],
        "--established-passes 101: give 1 to 100 passes of the trace",
    );
}
