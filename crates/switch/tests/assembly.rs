//! A switch built from a configuration string, without the command line: two workers, a
//! capture in, a capture out, flow records as CSV. Every packet is counted once, both
//! workers take a share, the output capture holds every forwarded packet, and the records
//! add up to the packets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use stateplane_gen::{GenConfig, Workload, generate};
use stateplane_io::capture::{CaptureFormat, CaptureWriter};
use stateplane_runtime::{Counter, RxPort};
use stateplane_switch::Switch;
use std::path::Path;

const PACKETS: u64 = 20_000;

fn write_trace(path: &Path) {
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut w = CaptureWriter::new(file, CaptureFormat::PcapNano).unwrap();
    let mut cfg = GenConfig::new(Workload::Internet, PACKETS);
    cfg.seed = 7;
    generate(
        &cfg,
        |ts, frame| w.write(ts, frame, frame.len() as u32),
        |_| {},
    )
    .unwrap();
    w.flush().unwrap();
}

fn packets_in(path: &Path) -> u64 {
    let mut r = stateplane_io::capture::FileRx::open(path).unwrap();
    let mut n = 0;
    while r.next_packet().unwrap().is_some() {
        n += 1;
    }
    n
}

#[test]
fn a_two_worker_switch_runs_from_a_configuration_string() {
    // Removed when dropped, also when the test fails.
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    write_trace(&dir.join("in.pcap"));
    let config = r#"
        workers = 2
        [program]
        name = "forward"
        [[port]]
        name = "in"
        rx = "in.pcap"
        [[port]]
        name = "out"
        tx = "out.pcap"
        [flows]
        csv = "flows.csv"
    "#;
    let switch = Switch::from_toml(config, dir).unwrap();
    assert!(!switch.is_live());
    assert!(switch.input_size() > 0);
    let outcome = switch.run().unwrap();
    assert_eq!(outcome.error(), None);
    let report = &outcome.report;
    assert_eq!(report.total.get(Counter::RxPackets), PACKETS);
    assert_eq!(
        report.total.get(Counter::TxPackets),
        PACKETS,
        "forward sends in to out"
    );
    assert_eq!(report.per_worker.len(), 2);
    for (w, s) in report.per_worker.iter().enumerate() {
        assert!(
            s.get(Counter::RxPackets) > PACKETS / 10,
            "worker {w} took a share"
        );
    }
    assert_eq!(packets_in(&dir.join("out.pcap")), PACKETS);
    let flows = outcome.flows.as_ref().expect("flow records");
    assert_eq!(flows.stages.packets, PACKETS);
    let csv = std::fs::read_to_string(dir.join("flows.csv")).unwrap();
    let records = csv.lines().count() as u64 - 1;
    assert_eq!(records, flows.export.records);
    assert!(records > 100, "{records} records");
}

/// A bad key is refused by name before anything is opened.
#[test]
fn a_configuration_with_an_unknown_key_is_refused_by_name() {
    let err = Switch::from_toml("workerz = 2", Path::new("."))
        .err()
        .expect("refused");
    assert!(err.contains("workerz"), "{err}");
    let err = Switch::from_toml(
        "workers = 0\n[[port]]\nname = \"in\"\nrx = \"x.pcap\"",
        Path::new("."),
    )
    .err()
    .expect("refused");
    assert!(err.contains("workers: 0 is outside 1 to 64"), "{err}");
}

/// A flow monitor built without the command line, over one capture in each way of reading
/// it with two workers: every packet is in a record, and the CSV holds every record.
#[test]
fn a_two_worker_flow_monitor_counts_every_packet_whichever_way_it_reads() {
    use stateplane_switch::flow_export::FlowSettings;
    use stateplane_switch::flow_monitor::{
        FlowMonitor, MonitorOptions, MonitorOutcome, ReadAheadChoice,
    };
    // Removed when dropped, also when the test fails.
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let trace = dir.join("in.pcap");
    write_trace(&trace);
    for read_ahead in [
        ReadAheadChoice::Chunks,
        ReadAheadChoice::On,
        ReadAheadChoice::Off,
    ] {
        let csv = dir.join(format!("{read_ahead:?}.csv"));
        let monitor = FlowMonitor::build(MonitorOptions {
            inputs: vec![trace.clone()],
            settings: FlowSettings {
                csv: Some(csv.clone()),
                ..FlowSettings::default()
            },
            workers: 2,
            read_ahead,
            hash_seed: Some(3),
            ..MonitorOptions::default()
        })
        .unwrap();
        assert!(!monitor.is_live());
        assert_eq!(
            monitor.input_size(),
            std::fs::metadata(&trace).unwrap().len()
        );
        let MonitorOutcome::Files {
            flows,
            input,
            errors,
            ..
        } = monitor.run().unwrap()
        else {
            panic!("a run over files");
        };
        assert_eq!(
            (input.malformed_total(), errors.len()),
            (0, 0),
            "{read_ahead:?}"
        );
        assert_eq!(
            (flows.stages.packets, input.read),
            (PACKETS, PACKETS),
            "{read_ahead:?}"
        );
        let records = std::fs::read_to_string(&csv).unwrap().lines().count() as u64 - 1;
        assert_eq!(records, flows.export.records, "{read_ahead:?}");
        assert!(records > 100, "{read_ahead:?}: {records} records");
    }
    let refused = FlowMonitor::build(MonitorOptions {
        workers: 1,
        ..MonitorOptions::default()
    });
    let err = refused.err().expect("no input is refused");
    assert!(err.contains("--in FILE"), "{err}");
}
