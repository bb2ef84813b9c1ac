//! Flow records end to end through the `stateplane` binary: a `[flows]` section on any
//! program's run (records of what it forwarded, with the egress port it chose), IPFIX
//! files (RFC 5655) and IPFIX over TCP read back by our decoder, and pcapng input. The
//! collectors' side (nfcapd/nfdump, tshark over UDP) is scripts/test-flows-collectors.sh.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{bin, interrupted_mid_input, ok, refused, tmp, tool, write_capture};
use stateplane_flows::FlowRecord;
use stateplane_flows::flow_stats::Fate;
use stateplane_flows::ipfix::Decoder;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

fn generate(packets: u32, seed: u32, path: &Path) {
    let args = ["gen", "internet", "--packets", &packets.to_string()];
    ok(bin()
        .args(args)
        .args(["--seed", &seed.to_string(), "-o"])
        .arg(path)
        .output()
        .unwrap());
}

/// Decodes back-to-back IPFIX messages (a file or a TCP stream), checking that each
/// message's sequence number counts the data records sent before it.
fn decode_stream(bytes: &[u8]) -> Vec<FlowRecord> {
    let mut decoder = Decoder::default();
    let mut records = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        assert!(rest.len() >= 16, "a message header cut short");
        let len = usize::from(u16::from_be_bytes([rest[2], rest[3]]));
        assert!(len >= 16 && len <= rest.len(), "message length {len}");
        let (header, mut got) = decoder.decode(&rest[..len]).unwrap();
        assert_eq!(
            header.sequence as usize,
            records.len(),
            "sequence = records before this message"
        );
        records.append(&mut got);
        rest = &rest[len..];
    }
    records
}

/// A CSV file as rows of named columns.
fn csv_rows(path: &Path) -> Vec<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
    lines
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split(',').map(String::from))
                .collect()
        })
        .collect()
}

/// The CSV lines of `flows` over `input` with every feature and `flags`, written to a
/// file named `name`, sorted (the order of records depends on the workers').
fn sorted_records(input: &Path, flags: &[&str], name: &str) -> Vec<String> {
    let out = tmp(name);
    ok(bin()
        .args(["flows", "--hash-seed", "1", "--features", "all", "-i"])
        .arg(input)
        .args(flags)
        .arg("--csv")
        .arg(&out)
        .output()
        .unwrap());
    sorted_lines(&out)
}

/// The lines of the file `path`, sorted.
fn sorted_lines(path: &Path) -> Vec<String> {
    let mut lines: Vec<String> = (std::fs::read_to_string(path).unwrap().lines())
        .map(String::from)
        .collect();
    lines.sort();
    lines
}

fn number(row: &BTreeMap<String, String>, column: &str) -> u64 {
    row[column].parse().unwrap()
}

#[test]
fn a_flows_section_records_what_any_program_forwarded_with_its_egress_port() {
    let trace = tmp("section.pcap");
    generate(20_000, 3, &trace);
    std::fs::write(
        tmp("section.rules"),
        "table=0,priority=10,tcp,actions=output:1\n\
         table=0,priority=10,udp,actions=output:2\n\
         table=0,priority=10,tcp6,actions=output:1\n",
    )
    .unwrap();
    let cfg = tmp("section.toml");
    std::fs::write(
        &cfg,
        "workers = 2\n[program]\nname = \"pipeline\"\n[program.pipeline]\nrules_file = \"section.rules\"\n\
         [[port]]\nname = \"in\"\nrx = \"section.pcap\"\n[[port]]\nname = \"tcp\"\n[[port]]\nname = \"udp\"\n\
         [flows]\ncsv = \"section.csv\"\nipfix_file = [\"section.ipfix\"]\nfeatures = \"all\"\n",
    )
    .unwrap();
    let text = ok(bin()
        .args(["run", "--json", "-c"])
        .arg(&cfg)
        .output()
        .unwrap());
    let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rows = csv_rows(&tmp("section.csv"));
    let (mut tcp, mut udp, mut other) = (0, 0, 0);
    for row in &rows {
        let out_port = row["out_port"].as_str();
        let fate = (row["forwarding"].as_str(), row["drop_reason"].as_str());
        let v6 = row["src"].contains(':');
        match (number(row, "proto"), v6) {
            (6, _) => tcp += assert_port(row, out_port, "1"),
            (17, false) => udp += assert_port(row, out_port, "2"),
            // Dropped by the table's miss (UDP over IPv6 among them): no egress port, and
            // the reason named.
            _ => {
                assert_eq!(fate, ("dropped", "no_match"), "{row:?}");
                other += assert_port(row, out_port, "")
            }
        }
        if fate.0 == "forwarded" {
            assert_eq!(fate.1, "", "{row:?}");
        }
    }
    assert_eq!(
        summary["drops"]["no_match"], other,
        "the dropped flows' packets"
    );
    let packets = summary["counters"]["rx_packets"].as_u64().unwrap();
    assert!(
        tcp > 1000 && udp > 100 && other > 100,
        "tcp {tcp}, udp {udp}, other {other}"
    );
    assert_eq!(tcp + udp + other, packets, "every packet in one record");
    assert_eq!(
        tcp + udp,
        summary["counters"]["tx_packets"].as_u64().unwrap(),
        "what was forwarded"
    );
    let flows = &summary["flows"];
    assert_eq!(flows["packets"], packets);
    assert_eq!(flows["records"], rows.len() as u64);
    assert_eq!(flows["records_exported"], rows.len() as u64);

    // The IPFIX file holds the same records as the CSV.
    let records = decode_stream(&std::fs::read(tmp("section.ipfix")).unwrap());
    assert_eq!(records.len(), rows.len());
    let sum = |f: fn(&FlowRecord) -> u64| records.iter().map(f).sum::<u64>();
    assert_eq!(sum(FlowRecord::packets), packets);
    let csv_bytes: u64 = rows.iter().map(|r| number(r, "bytes")).sum();
    assert_eq!(sum(FlowRecord::bytes), csv_bytes);
    let by_port = |port| {
        (records.iter())
            .filter(|r| r.forward.out_port == port)
            .map(FlowRecord::packets)
            .sum::<u64>()
    };
    assert_eq!((by_port(1), by_port(2)), (tcp, udp));
    // Their fate too: forwardingStatus and the exact reason, as the CSV has it.
    let dropped = (records.iter())
        .filter(|r| matches!(Fate::of(r.forward.out_port), Fate::Dropped(c) if c >= 16))
        .map(FlowRecord::packets)
        .sum::<u64>();
    assert_eq!(dropped, other);
}

/// Counts a record's packets after checking its egress port column.
fn assert_port(row: &BTreeMap<String, String>, got: &str, want: &str) -> u64 {
    assert_eq!(got, want, "egress port of {row:?}");
    number(row, "packets")
}

/// A flow table too small for the trace's flows: what it exported early is counted, and
/// the summary names the setting that makes it larger.
#[test]
fn a_full_flow_table_is_reported_with_its_fix() {
    let trace = tmp("full-table.pcap");
    generate(20_000, 4, &trace);
    let csv = tmp("full-table.csv");
    let out = bin()
        .args(["flows", "-i"])
        .arg(&trace)
        .args(["--max-flows", "16", "--csv"])
        .arg(&csv)
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&out.stderr).to_string() + &ok(out);
    let line = (summary.lines())
        .find(|l| l.starts_with("evicted (full)"))
        .unwrap_or_else(|| panic!("no eviction line in:\n{summary}"));
    let evicted: u64 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(evicted > 0, "{line}");
    assert!(
        line.contains("the flow table was full: --max-flows"),
        "{line}"
    );
    let early = (csv_rows(&csv).iter())
        .filter(|r| r["end_reason"] == "lack_of_resources")
        .count() as u64;
    // Those evicted while open say why; a flow TCP had closed leaves first, as an end of
    // flow (only its final ACK could still have joined it).
    assert!(early > 0 && early <= evicted, "{early} of {evicted}");
}

/// `flows --csv - | head`: the reader closing the pipe ends the records quietly, as a
/// shell pipeline's writer does, and the run still succeeds and says where it stopped.
#[test]
fn a_reader_closing_standard_output_is_no_failure() {
    let trace = tmp("reader-gone.pcap");
    generate(20_000, 5, &trace);
    let mut child = bin()
        .args(["flows", "-i"])
        .arg(&trace)
        .args(["--csv", "-"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    read_the_header_and_go(&mut child);
    // The reader is gone, with the records still coming (far more than a pipe holds).
    let out = child.wait_with_output().unwrap();
    let summary = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{summary}");
    assert!(
        summary.contains("then its reader closed the pipe"),
        "{summary}"
    );
    assert!(!summary.contains("error"), "{summary}");
}

/// Reads the CSV header `child` writes to its standard output, then closes the pipe's
/// reading end, as `head -1` would.
fn read_the_header_and_go(child: &mut std::process::Child) {
    use std::io::BufRead;
    let mut header = String::new();
    let stdout = child.stdout.take().unwrap();
    std::io::BufReader::new(stdout)
        .read_line(&mut header)
        .unwrap();
    assert!(header.starts_with("src,dst,"), "{header}");
}

/// On an interface too, the reader going ends the capture (`flows -I eth0 --csv - | head`,
/// as tcpdump's would), where before the capture went on until it was stopped: records are
/// all it makes. Traffic on loopback, a new flow every 10 ms for at most 20 s.
#[test]
fn a_reader_closing_standard_output_ends_a_live_capture() {
    let mut child = bin()
        .args([
            "flows",
            "-I",
            "lo",
            "--csv",
            "-",
            "--inactive-timeout",
            "0.2",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = {
        let done = done.clone();
        std::thread::spawn(move || {
            let to = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let start = std::time::Instant::now();
            while !done.load(std::sync::atomic::Ordering::Relaxed)
                && start.elapsed() < std::time::Duration::from_secs(20)
            {
                // A socket of its own each time: a flow of its own.
                let from = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                let _ = from.send_to(b"flow", to.local_addr().unwrap());
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })
    };
    read_the_header_and_go(&mut child);
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > std::time::Duration::from_secs(15) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    sender.join().unwrap();
    let out = child.wait_with_output().unwrap();
    let summary = String::from_utf8_lossy(&out.stderr).to_string();
    let status = status.unwrap_or_else(|| panic!("still capturing 15 s on: {summary}"));
    assert!(status.success(), "{summary}");
    assert!(
        summary.contains("then its reader closed the pipe"),
        "{summary}"
    );
}

/// A TCP collector on `listener`: the bytes of its first connection, until the exporter
/// closes it (or 60 s pass without one).
fn tcp_collector(listener: std::net::TcpListener) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        let mut bytes = Vec::new();
        conn.read_to_end(&mut bytes).unwrap();
        bytes
    })
}

#[test]
fn ipfix_over_tcp_reaches_a_tcp_collector_whole() {
    let trace = tmp("tcp.pcap");
    generate(20_000, 5, &trace);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let collector = tcp_collector(listener);
    let text = ok(bin()
        .args([
            "flows",
            "--biflow",
            "--workers",
            "2",
            "--summary-json",
            "-i",
        ])
        .arg(&trace)
        .args(["--ipfix-tcp", &addr.to_string()])
        .output()
        .unwrap());
    let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
    let records = decode_stream(&collector.join().unwrap());
    assert_eq!(summary["records"], records.len() as u64);
    assert_eq!(summary["records_exported"], records.len() as u64);
    assert_eq!(summary["sinks"][0]["unconfirmed_messages"], 0);
    assert_eq!(
        summary["packets"],
        records.iter().map(FlowRecord::packets).sum::<u64>()
    );
    assert_eq!(
        summary["bytes"],
        records.iter().map(FlowRecord::bytes).sum::<u64>()
    );
    let both_ways = records.iter().filter(|r| r.reverse.is_some()).count();
    assert!(
        both_ways * 2 > records.len(),
        "biflows: {both_ways} of {} records have both directions",
        records.len()
    );

    // No collector there: the error names the flag and asks the question.
    drop(std::net::TcpListener::bind(addr).map(drop));
    let out = bin()
        .args(["flows", "-i"])
        .arg(&trace)
        .args(["--ipfix-tcp", &addr.to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--ipfix-tcp") && err.contains("is a collector listening there?"),
        "{err}"
    );
}

/// `--ipfix-spool`: a run whose TCP collector is not there still runs, fails at the end
/// saying how many records wait in the spool and where; the next run (the collector back)
/// sends them first, and the collector then holds both runs' records, each once. A spool
/// without a TCP collector is refused.
#[test]
fn a_spooled_tcp_collector_gets_a_run_it_missed_in_the_next_run() {
    let trace = tmp("spool.pcap");
    generate(5_000, 7, &trace);
    let spool = tmp("spool-dir");
    let _ = std::fs::remove_dir_all(&spool);
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let run = || {
        bin()
            .args(["flows", "--summary-json", "-i"])
            .arg(&trace)
            .args(["--ipfix-tcp", &addr.to_string(), "--ipfix-spool"])
            .arg(&spool)
            .output()
            .unwrap()
    };
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let missed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let taken = missed["records"].as_u64().unwrap();
    assert!(taken > 0);
    assert_eq!(missed["records_exported"], 0);
    assert_eq!(missed["sinks"][0]["spool"]["records_waiting"], taken);
    assert_eq!(missed["sinks"][0]["records_lost"], 0);
    assert!(err.contains(&format!("{taken} records wait in")), "{err}");

    let collector = tcp_collector(std::net::TcpListener::bind(addr).unwrap());
    let out = run();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records = decode_stream(&collector.join().unwrap());
    assert_eq!(
        records.len() as u64,
        2 * taken,
        "the missed run's records, then this one's"
    );
    let once: std::collections::HashSet<_> =
        records[..taken as usize].iter().map(|r| r.key).collect();
    assert_eq!(once.len() as u64, taken, "no record twice");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["sinks"][0]["spool"]["records_waiting"], 0);

    let (trace, spool_dir) = (trace.to_string_lossy(), spool.to_string_lossy());
    let udp_only = [
        "flows",
        "-i",
        &trace,
        "--ipfix",
        "127.0.0.1:9",
        "--ipfix-spool",
        &spool_dir,
    ];
    refused(
        &udp_only,
        "--ipfix-spool: a spool keeps what TCP collectors miss; give --ipfix-tcp too",
    );
    let _ = std::fs::remove_dir_all(&spool);
}

/// A CSV file on a disk too small for it (a 64 KiB tmpfs): the run fails saying the disk
/// refuses writes and how many records were lost, and the file holds whole lines only:
/// those the summary counts as written.
#[test]
fn a_flow_file_on_a_full_disk_keeps_whole_lines_and_counts_what_was_lost() {
    let trace = tmp("full-disk.pcap");
    generate(20_000, 8, &trace);
    let disk = tmp("full-disk-mount");
    std::fs::create_dir_all(&disk).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&disk)
        .status()
        .unwrap();
    assert!(mounted.success(), "mounting a small tmpfs needs root");
    let csv = disk.join("flows.csv");
    let out = bin()
        .args(["flows", "--summary-json", "-i"])
        .arg(&trace)
        .arg("--csv")
        .arg(&csv)
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&csv).unwrap_or_default();
    let _ = std::process::Command::new("umount").arg(&disk).status();
    let _ = std::fs::remove_dir_all(&disk);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the disk refuses writes (No space left on device"),
        "{err}"
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sink = &summary["sinks"][0];
    let (written, lost) = (
        sink["records"].as_u64().unwrap(),
        sink["records_lost"].as_u64().unwrap(),
    );
    assert!(written > 0 && lost > 0, "{sink}");
    assert_eq!(
        written + lost,
        summary["records"].as_u64().unwrap(),
        "{sink}"
    );
    assert!(text.ends_with('\n'), "whole lines only");
    assert_eq!(
        text.lines().count() as u64,
        written + 1,
        "the header and every record written"
    );
}

/// IPFIX over UDP to a port nobody listens on: the run fails, and its summary says the
/// collector is unreachable and that no record was delivered (it said 0 lost and exited 0).
#[test]
fn ipfix_over_udp_to_no_collector_fails_and_says_so() {
    let trace = tmp("unreachable.pcap");
    generate(20_000, 6, &trace);
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = bin()
        .args(["flows", "--summary-json", "--mtu", "1400", "-i"])
        .arg(&trace)
        .args(["--ipfix", &port.to_string()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let summary: serde_json::Value =
        serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let sink = &summary["sinks"][0];
    assert_eq!(sink["unreachable"], true, "{summary}");
    assert!(sink["lost_messages"].as_u64().unwrap() > 1, "{summary}");
    assert_eq!(summary["records_exported"], 0, "{summary}");
    assert!(summary["records_taken"].as_u64().unwrap() > 0, "{summary}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the collector is unreachable"), "{err}");
}

/// A UDP collector on loopback that keeps every datagram it receives.
struct UdpCollector {
    addr: std::net::SocketAddr,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Vec<u8>>>,
}

impl UdpCollector {
    fn start() -> UdpCollector {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        socket
            .set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sent = done.clone();
        // Reads until the run has ended and nothing more arrives.
        let thread = std::thread::spawn(move || {
            let mut datagrams = Vec::new();
            let mut buf = vec![0u8; 70_000];
            loop {
                match socket.recv(&mut buf) {
                    Ok(n) => datagrams.push(buf[..n].to_vec()),
                    Err(_) if sent.load(std::sync::atomic::Ordering::Acquire) => break,
                    Err(_) => {}
                }
            }
            datagrams
        });
        UdpCollector { addr, done, thread }
    }

    /// What it received, once the run that sent it has ended.
    fn datagrams(self) -> Vec<Vec<u8>> {
        self.done.store(true, std::sync::atomic::Ordering::Release);
        self.thread.join().unwrap()
    }
}

/// NetFlow v9 over UDP: each datagram one message of version 9 numbered by the messages
/// before it, every record of the run in them with the packets and bytes the summary
/// gives, a biflow as two one-way records; `all` is all NetFlow v9 carries, and what it
/// cannot carry is refused when named.
#[test]
fn netflow9_over_udp_carries_every_record_numbered_by_message() {
    let trace = tmp("netflow9.pcap");
    generate(20_000, 7, &trace);
    for biflow in [false, true] {
        let collector = UdpCollector::start();
        let mut cmd = bin();
        // `all`: all that NetFlow v9 carries.
        cmd.args([
            "flows",
            "--summary-json",
            "--mtu",
            "1400",
            "--features",
            "all",
        ])
        .arg("--netflow9")
        .arg(collector.addr.to_string())
        .arg("-i")
        .arg(&trace);
        if biflow {
            cmd.arg("--biflow");
        }
        let text = ok(cmd.output().unwrap());
        let datagrams = collector.datagrams();
        let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
        let sink = &summary["sinks"][0];
        assert!(
            sink["sink"]
                .as_str()
                .unwrap()
                .starts_with("netflow9 udp 127.0.0.1:"),
            "{sink}"
        );
        assert_eq!(sink["messages"], datagrams.len() as u64);
        let mut decoder = stateplane_flows::ipfix::Decoder::default();
        let mut records = Vec::new();
        for (i, d) in datagrams.iter().enumerate() {
            assert!(d.len() <= 1400);
            let (header, r) = decoder.decode(d).unwrap();
            assert_eq!((header.version, header.sequence), (9, i as u32));
            records.extend(r);
        }
        assert_eq!(sink["records"], records.len() as u64, "biflow {biflow}");
        let packets: u64 = records.iter().map(|r| r.packets()).sum();
        let bytes: u64 = records.iter().map(|r| r.bytes()).sum();
        assert_eq!(
            (summary["packets"].as_u64(), summary["bytes"].as_u64()),
            (Some(packets), Some(bytes))
        );
        let flows = summary["records"].as_u64().unwrap();
        if biflow {
            // Each biflow whose other side answered is two records.
            assert!(records.len() as u64 > flows, "{} of {flows}", records.len());
        } else {
            assert_eq!(records.len() as u64, flows);
        }
    }
    let trace = trace.to_str().unwrap();
    let flows = [
        "flows",
        "-i",
        trace,
        "--netflow9",
        "127.0.0.1:2055",
        "--features",
    ];
    refused(
        &[&flows[..], &["all,iat"]].concat(),
        "--features: `iat` has no NetFlow v9 field (inter-arrival times are enterprise \
         elements, which only IPFIX has): leave it out of the features, or export IPFIX (a \
         --netflow9 collector is given)",
    );
    // `flows` watches packets: what became of them is a run's to say.
    refused(
        &[
            "flows",
            "-i",
            trace,
            "--csv",
            "-",
            "--features",
            "counts,forwarding",
        ],
        "--features: `forwarding` is what a program did with each flow's packets",
    );
}

/// Over UDP, messages are as large as the route to the collector carries (64 KiB on
/// loopback) unless `--mtu` says otherwise, and either way every datagram is a whole
/// message whose sequence number counts the records before it; bad sizes and rates are
/// refused with what is expected.
#[test]
fn ipfix_over_udp_fills_what_the_path_carries() {
    let trace = tmp("udp.pcap");
    generate(20_000, 6, &trace);
    for mtu in ["auto", "1400"] {
        let collector = UdpCollector::start();
        let addr = collector.addr;
        let text = ok(bin()
            .args([
                "flows",
                "--summary-json",
                "--mtu",
                mtu,
                "--ipfix",
                &addr.to_string(),
                "-i",
            ])
            .arg(&trace)
            .output()
            .unwrap());
        let datagrams = collector.datagrams();
        let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
        let records = decode_stream(&datagrams.concat());
        assert_eq!(summary["records"], records.len() as u64, "--mtu {mtu}");
        assert_eq!(summary["sinks"][0]["messages"], datagrams.len() as u64);
        // The summary says how large the messages may be, which `auto` found on the route.
        let name = summary["sinks"][0]["sink"].as_str().unwrap();
        let limit = name
            .split("up to ")
            .nth(1)
            .and_then(|t| t.split(' ').next());
        let limit: usize = limit.and_then(|n| n.parse().ok()).expect(name);
        assert!(datagrams.iter().all(|d| d.len() <= limit), "{name}");
        assert!(limit >= 1400, "{name}");
        let largest = datagrams.iter().map(Vec::len).max().unwrap();
        if mtu == "auto" {
            assert!(
                (1473..=65_507).contains(&largest),
                "auto: the largest message is {largest} bytes (loopback carries 64 KiB)"
            );
        } else {
            assert!(
                (1300..=1400).contains(&largest),
                "--mtu 1400: {largest} bytes"
            );
        }
    }
    refused(
        &["flows", "-i", "x.pcap", "--csv", "-", "--mtu", "100"],
        "--mtu <MTU>': '100' is neither auto nor a number of bytes from 512 to 65535",
    );
    refused(
        &[
            "flows",
            "-i",
            trace.to_str().unwrap(),
            "--csv",
            "-",
            "--ipfix-gso",
        ],
        "--ipfix-gso: segmentation offload is for IPFIX or NetFlow v9 over UDP, and no --ipfix \
         or --netflow9 HOST:PORT",
    );
    refused(
        &["flows", "-i", "x.pcap", "--csv", "-", "--ipfix-rate", "2x"],
        "'2x' is neither auto nor bytes per second: a number, with k, M or G (e.g. 28M), or 0",
    );
}

#[test]
fn pcapng_input_gives_the_same_records_as_pcap() {
    let (pcap, pcapng) = (tmp("same.pcap"), tmp("same.pcapng"));
    generate(10_000, 9, &pcap);
    generate(10_000, 9, &pcapng);
    assert_ne!(
        std::fs::read(&pcap).unwrap()[..4],
        std::fs::read(&pcapng).unwrap()[..4],
        "two formats"
    );
    let (a, b) = (
        sorted_records(&pcap, &[], "same-pcap.csv"),
        sorted_records(&pcapng, &[], "same-pcapng.csv"),
    );
    assert!(a.len() > 500, "{} records", a.len());
    assert_eq!(a, b);
    // Several workers read pcapng in chunks (auto, with the interfaces each chunk's records
    // need carried from chunk to chunk), or through one reader thread.
    for (layout, name) in [
        (&["--workers", "2"][..], "same-pcapng-2.csv"),
        (
            &["--workers", "3", "--read-ahead", "chunks"],
            "same-pcapng-3.csv",
        ),
        (
            &["--workers", "2", "--read-ahead", "on"],
            "same-pcapng-2-on.csv",
        ),
    ] {
        assert_eq!(sorted_records(&pcapng, layout, name), a, "{layout:?}");
    }
    // Chunks of several files are refused with the way out.
    let (pcap, pcapng) = (pcap.to_str().unwrap(), pcapng.to_str().unwrap());
    let args = ["flows", "--read-ahead", "chunks", "--csv", "-"];
    let inputs = ["-i", pcap, "-i", pcapng];
    refused(
        &[&args[..], &inputs].concat(),
        "--read-ahead chunks reads one capture file",
    );
}

/// `frame` (Ethernet, untagged IP) with its Ethernet header replaced by the header of
/// link type `linktype` (for the Linux cooked ones: received on interface 3 from the
/// frame's source MAC), and its length on the wire changed to match.
fn as_link_type(frame: &[u8], orig_len: u32, linktype: u32) -> (Vec<u8>, u32) {
    let (source, ethertype, rest) = (&frame[6..12], &frame[12..14], &frame[14..]);
    let header = match linktype {
        1 => frame[..14].to_vec(),
        113 => [&[0, 0, 0, 1, 0, 6][..], source, &[0, 0], ethertype].concat(),
        276 => [ethertype, &[0, 0, 0, 0, 0, 3, 0, 1, 0, 6], source, &[0, 0]].concat(),
        101 => Vec::new(),
        // BSD loopback: AF_INET, or macOS's AF_INET6, in little-endian order.
        0 if ethertype == [8, 0] => 2u32.to_le_bytes().to_vec(),
        0 => 30u32.to_le_bytes().to_vec(),
        _ => unreachable!("no such link type here"),
    };
    let orig_len = orig_len - 14 + header.len() as u32;
    ([header, rest.to_vec()].concat(), orig_len)
}

/// Appends the little-endian words `words` to `out`.
fn words(out: &mut Vec<u8>, words: &[u32]) {
    (words.iter()).for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
}

/// A pcapng section header (version 1.0, length not given).
fn pcapng_section() -> Vec<u8> {
    let mut out = Vec::new();
    words(
        &mut out,
        &[0x0a0d_0d0a, 28, 0x1a2b_3c4d, 1, u32::MAX, u32::MAX, 28],
    );
    out
}

/// Appends a pcapng interface description of link type `linktype`, in microseconds.
fn pcapng_interface(out: &mut Vec<u8>, linktype: u32) {
    words(out, &[1, 20, linktype, 262_144, 20]);
}

/// Appends an enhanced packet block of `data` on interface `interface`.
fn pcapng_packet(out: &mut Vec<u8>, interface: u32, ts_ns: u64, data: &[u8], orig_len: u32) {
    let micros = ts_ns / 1000;
    let padded = data.len().next_multiple_of(4);
    let total = 32 + padded as u32;
    let (high, low) = ((micros >> 32) as u32, micros as u32);
    words(
        out,
        &[6, total, interface, high, low, data.len() as u32, orig_len],
    );
    out.extend_from_slice(data);
    out.resize(out.len() + padded - data.len(), 0);
    words(out, &[total]);
}

/// `frames` (Ethernet, untagged IP) as a capture of link type `linktype`
/// ([`as_link_type`]), in pcap or pcapng.
fn host_capture(frames: &[(u64, Vec<u8>, u32)], linktype: u32, pcapng: bool) -> Vec<u8> {
    let packets = (frames.iter()).map(|(ts_ns, frame, orig_len)| {
        let (data, orig_len) = as_link_type(frame, *orig_len, linktype);
        (*ts_ns, data, orig_len)
    });
    capture_of(linktype, pcapng, packets)
}

/// A capture of link type `linktype`, in pcap or pcapng (microseconds), of `packets`: each
/// its time in nanoseconds, its bytes and its length on the wire.
fn capture_of(
    linktype: u32,
    pcapng: bool,
    packets: impl IntoIterator<Item = (u64, Vec<u8>, u32)>,
) -> Vec<u8> {
    let mut out = Vec::new();
    if pcapng {
        out = pcapng_section();
        pcapng_interface(&mut out, linktype);
    } else {
        // Microsecond pcap: magic, version 2.4, zone, sigfigs, snap length, link type.
        words(
            &mut out,
            &[0xa1b2_c3d4, 0x0004_0002, 0, 0, 262_144, linktype],
        );
    }
    for (ts_ns, data, orig_len) in packets {
        if pcapng {
            pcapng_packet(&mut out, 0, ts_ns, &data, orig_len);
        } else {
            let (secs, micros) = (ts_ns / 1_000_000_000, ts_ns % 1_000_000_000 / 1000);
            words(
                &mut out,
                &[secs as u32, micros as u32, data.len() as u32, orig_len],
            );
            out.extend_from_slice(&data);
        }
    }
    out
}

/// The untagged IP frames (IPv4, and IPv6 if `v6`) of a generated trace of `packets`
/// packets with `seed`, each its time, its bytes and its length on the wire.
fn untagged_ip_frames(name: &str, packets: u32, seed: u32, v6: bool) -> Vec<(u64, Vec<u8>, u32)> {
    let generated = tmp(name);
    generate(packets, seed, &generated);
    let ip = |f: &[u8]| f[12..14] == [8, 0] || (v6 && f[12..14] == [0x86, 0xdd]);
    (stateplane_io::capture::read_all(&generated)
        .unwrap()
        .into_iter())
    .filter(|(_, f, _)| f.len() >= 34 && ip(f))
    .collect()
}

/// Captures a host makes (Linux cooked SLL and SLL2 from `tcpdump -i any`, raw IP, BSD
/// loopback), in pcap and pcapng, give the records of the Ethernet capture they were made
/// from, one packet counted per record, with one worker or two, and tshark counts as many
/// packets in each. Where a cooked interface is described after packets of an Ethernet
/// one, a stream reads both, and the workers' chunks refuse it with the way out.
#[test]
fn captures_of_host_link_types_give_the_records_of_their_ethernet_capture() {
    let frames = untagged_ip_frames("host-generated.pcap", 5_000, 11, true);
    assert!(frames.len() > 4_000, "{} untagged IP frames", frames.len());
    let ethernet = tmp("host-ethernet.pcap");
    std::fs::write(&ethernet, host_capture(&frames, 1, false)).unwrap();
    let want = sorted_records(&ethernet, &[], "host-ethernet.csv");
    assert!(want.len() > 300, "{} records", want.len());
    for (linktype, pcapng) in [
        (113, false),
        (276, false),
        (276, true),
        (101, false),
        (0, false),
        (0, true),
    ] {
        let name = format!("host-{linktype}.{}", if pcapng { "pcapng" } else { "pcap" });
        let path = tmp(&name);
        std::fs::write(&path, host_capture(&frames, linktype, pcapng)).unwrap();
        let counted = ok(tool("capinfos")
            .args(["-M", "-c"])
            .arg(&path)
            .output()
            .unwrap());
        let want_count = format!("Number of packets:   {}", frames.len());
        assert!(counted.contains(&want_count), "{name}: {counted}");
        // SLL2 names the interface (3, arriving): the records' way in is its port, 2.
        let want = match linktype {
            276 => with_column(&want, "in_port", "2"),
            _ => want.clone(),
        };
        for workers in ["1", "2"] {
            let flags = ["--workers", workers];
            let got = sorted_records(&path, &flags, &format!("{name}-{workers}.csv"));
            assert_eq!(got, want, "{name}, {workers} workers");
        }
        let summary = ok(bin()
            .args(["flows", "--summary-json", "--csv", "/dev/null", "-i"])
            .arg(&path)
            .output()
            .unwrap());
        let summary: serde_json::Value = serde_json::from_str(summary.trim()).unwrap();
        assert_eq!(summary["packets"], frames.len(), "{name}: {summary}");
        assert_eq!(summary["not_ip"], 0, "{name}: {summary}");
    }
    // An Ethernet interface, its packets, then a cooked one described.
    let mut mixed = pcapng_section();
    pcapng_interface(&mut mixed, 1);
    let (half, rest) = frames.split_at(frames.len() / 2);
    for (ts_ns, frame, orig_len) in half {
        pcapng_packet(&mut mixed, 0, *ts_ns, frame, *orig_len);
    }
    pcapng_interface(&mut mixed, 276);
    for (ts_ns, frame, orig_len) in rest {
        let (data, orig_len) = as_link_type(frame, *orig_len, 276);
        pcapng_packet(&mut mixed, 1, *ts_ns, &data, orig_len);
    }
    let path = tmp("host-mixed.pcapng");
    std::fs::write(&path, mixed).unwrap();
    let on = ["--workers", "2", "--read-ahead", "on"];
    let mixed = sorted_records(&path, &on, "host-mixed.csv");
    assert_eq!(mixed.len(), want.len());
    let path = path.to_str().unwrap();
    let chunks = [
        "flows",
        "--workers",
        "2",
        "--read-ahead",
        "chunks",
        "--csv",
        "/dev/null",
    ];
    refused(
        &[&chunks[..], &["-i", path]].concat(),
        "is on an interface of link type 276 (LINUX_SLL2 (Linux cooked capture v2, e.g. tcpdump -i any)), described after the file's start: chunks are read from Ethernet captures only; read it with --read-ahead on",
    );
}

/// CSV `lines` (a header among them) with `column` set to `value` in every record.
fn with_column(lines: &[String], column: &str, value: &str) -> Vec<String> {
    let header = (lines.iter()).find(|l| l.starts_with("src,")).unwrap();
    let at = header.split(',').position(|c| c == column).unwrap();
    let mut set: Vec<String> = (lines.iter())
        .map(|line| match line == header {
            true => line.clone(),
            false => {
                let mut fields: Vec<&str> = line.split(',').collect();
                fields[at] = value;
                fields.join(",")
            }
        })
        .collect();
    set.sort();
    set
}

/// `tcpdump -i any` on a host that routes: each packet captured arriving on one interface
/// and leaving by another (SLL2, which names both), so that its flow's record has the
/// interface it came in by and the one it left by (ports one below the kernel's indexes in
/// CSV and JSON, the indexes themselves in IPFIX); a flow a capture saw only leave has no
/// way in, one it saw only arrive no way out. SLL names the direction and no interface:
/// the input stands for it.
#[test]
fn cooked_captures_give_flows_the_interfaces_packets_were_seen_on() {
    let frames = untagged_ip_frames("seen-generated.pcap", 2_000, 5, false);
    let ethernet = tmp("seen-ethernet.pcap");
    std::fs::write(&ethernet, host_capture(&frames, 1, false)).unwrap();
    let want = sorted_records(&ethernet, &[], "seen-ethernet.csv");
    assert!(want.len() > 100, "{} records", want.len());
    // A cooked header that says interface `index`, arriving or leaving.
    let seen_on = |frame: &[u8], orig_len: u32, linktype: u32, index: u32, leaving: bool| {
        let (mut data, orig_len) = as_link_type(frame, orig_len, linktype);
        let packet_type = u8::from(leaving) * 4;
        match linktype {
            276 => {
                data[4..8].copy_from_slice(&index.to_be_bytes());
                data[10] = packet_type;
            }
            _ => data[1] = packet_type,
        }
        (data, orig_len)
    };
    // Each frame seen once for each of `seen`, a microsecond apart.
    let capture = |name: &str, linktype: u32, seen: &[(u32, bool)]| {
        let packets = (frames.iter()).flat_map(|(ts_ns, frame, orig_len)| {
            (seen.iter().enumerate()).map(move |(i, &(index, leaving))| {
                let (data, orig_len) = seen_on(frame, *orig_len, linktype, index, leaving);
                (ts_ns + i as u64 * 1000, data, orig_len)
            })
        });
        let path = tmp(name);
        std::fs::write(&path, capture_of(linktype, false, packets)).unwrap();
        path
    };
    // Routed: in by interface 2, out by 5. Each packet is seen twice, so it counts twice;
    // a FIN or RST ends its flow, and its second sight starts a record of its own, which
    // the capture saw only leave.
    let routed = capture("seen-routed.pcap", 276, &[(2, false), (5, true)]);
    let got = sorted_records(&routed, &["--workers", "2"], "seen-routed.csv");
    for count in ["packets", "bytes"] {
        let sum = |lines: &[String]| {
            column(lines, count)
                .iter()
                .map(|v| v.parse::<u64>().unwrap())
                .sum::<u64>()
        };
        assert_eq!(sum(&got), 2 * sum(&want), "{count}");
    }
    let ways = column(&got, "packets")
        .into_iter()
        .zip(column(&got, "in_port"))
        .zip(column(&got, "out_port"));
    for ((packets, way_in), way_out) in ways {
        let seen_leaving_only = packets == "1" && way_in.is_empty();
        assert!(
            way_in == "1" || seen_leaving_only,
            "{packets} {way_in} {way_out}"
        );
        assert_eq!(way_out, "4");
    }
    // Seen leaving by interface 7 only; arriving by 65,535 only (past what a record holds).
    let leaving = capture("seen-leaving.pcap", 276, &[(7, true)]);
    let got = sorted_records(&leaving, &[], "seen-leaving.csv");
    assert_eq!(
        got,
        with_column(&with_column(&want, "in_port", ""), "out_port", "6")
    );
    let past = capture("seen-past.pcap", 276, &[(65_535, false)]);
    let got = sorted_records(&past, &[], "seen-past.csv");
    assert_eq!(got, with_column(&want, "in_port", ""));
    // SLL2 whose interface index is 0 (none): the input stands for it, as for Ethernet.
    let unnamed = capture("seen-unnamed.pcap", 276, &[(0, false)]);
    assert_eq!(sorted_records(&unnamed, &[], "seen-unnamed.csv"), want);
    // SLL: leaving by the input's interface, whose port is the input's, 0.
    let sll = capture("seen-sll.pcap", 113, &[(0, true)]);
    let got = sorted_records(&sll, &[], "seen-sll.csv");
    assert_eq!(
        got,
        with_column(&with_column(&want, "in_port", ""), "out_port", "0")
    );
}

/// The values of `column` in CSV `lines` (a header among them), in their order.
fn column(lines: &[String], column: &str) -> Vec<String> {
    let header = (lines.iter()).find(|l| l.starts_with("src,")).unwrap();
    let at = header.split(',').position(|c| c == column).unwrap();
    (lines.iter())
        .filter(|l| *l != header)
        .map(|l| l.split(',').nth(at).unwrap().to_owned())
        .collect()
}

/// An Ethernet frame of `ethertype` and `payload`, from 02:00:00:00:00:01.
fn ethernet_frame(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let header = [
        &[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1][..],
        &ethertype.to_be_bytes(),
    ];
    [&header.concat()[..], payload].concat()
}

/// A TCP segment of `payload_len` bytes from 198.18.9.9:5555 to 198.19.9.9:80, its IPv4
/// total length 0 where it is above 64 KiB (as Linux BIG TCP and GRO capture it).
fn big_tcp_frame(payload_len: usize) -> Vec<u8> {
    let total = 40 + payload_len;
    let total_field = if total > 65_535 { 0 } else { total as u16 };
    let mut ip = vec![
        0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 6, 0, 0, 198, 18, 9, 9, 198, 19, 9, 9,
    ];
    ip[2..4].copy_from_slice(&total_field.to_be_bytes());
    // Ports 5555 and 80, sequence and acknowledgement numbers, data offset 5, ACK.
    let tcp = [
        0x15, 0xb3, 0, 80, 0, 0, 0, 1, 0, 0, 0, 1, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0,
    ];
    ethernet_frame(0x0800, &[&ip[..], &tcp, &vec![0x61; payload_len]].concat())
}

/// Every packet read is counted once in the summary, as `packets` (IP, in a flow), `not_ip`,
/// malformed by reason, or `oversize` (a frame above 64 KiB that is not IP), and they add
/// up to `read`, however the file is read. A segment above 64 KiB whose IP length field is
/// 0 (BIG TCP) is in its flow with all its bytes.
#[test]
fn every_packet_read_is_counted_once_and_big_segments_are_in_their_flows() {
    let generated = tmp("counts-generated.pcap");
    generate(3_000, 12, &generated);
    let mut frames = stateplane_io::capture::read_all(&generated).unwrap();
    let ts = frames[100].0;
    let ipv4 = (frames.iter().map(|f| f.1.clone()))
        .find(|f| f[12..14] == [8, 0] && f.len() > 40)
        .expect("an untagged IPv4 frame");
    // Its IPv4 header cut short, and its version field 6: a bad header.
    let mut version_6 = ipv4.clone();
    version_6[14] = 0x65;
    let extra = [
        big_tcp_frame(80_000),
        big_tcp_frame(100),
        ethernet_frame(0x88b5, &[7; 46]),
        ethernet_frame(0x88b5, &[7; 70_000]),
        ipv4[..30].to_vec(),
        version_6,
    ];
    frames.extend(extra.into_iter().map(|f| (ts, f.clone(), f.len() as u32)));
    let path = tmp("counts.pcap");
    frames.sort_by_key(|f| f.0);
    write_capture(&path, &frames, stateplane_io::CaptureFormat::PcapNano);
    let mut seen = Vec::new();
    for layout in [
        &["--workers", "1"][..],
        &["--workers", "2", "--read-ahead", "chunks"],
        &["--workers", "2", "--read-ahead", "on"],
        &["--workers", "2", "--read-ahead", "off"],
    ] {
        let csv = tmp("counts.csv");
        let summary = ok(bin()
            .args(["flows", "--summary-json", "-i"])
            .arg(&path)
            .args(layout)
            .arg("--csv")
            .arg(&csv)
            .output()
            .unwrap());
        let v: serde_json::Value = serde_json::from_str(summary.trim()).unwrap();
        let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
        assert_eq!(n("read"), frames.len() as u64, "{layout:?}: {v}");
        let parts = n("packets") + n("not_ip") + n("malformed") + n("oversize");
        assert_eq!(parts, n("read"), "{layout:?}: {v}");
        assert_eq!(
            (n("not_ip"), n("oversize"), n("malformed")),
            (1, 1, 2),
            "{layout:?}: {v}"
        );
        let reasons = &v["malformed_by_reason"];
        assert_eq!(
            (&reasons["ipv4_truncated"], &reasons["ipv4_bad_header"]),
            (&1.into(), &1.into())
        );
        let rows = csv_rows(&csv);
        let big = rows
            .iter()
            .find(|r| r["src"] == "198.18.9.9")
            .expect("the big segment's flow");
        // Both segments: 80,040 and 140 bytes of IP.
        assert_eq!(
            (number(big, "packets"), number(big, "bytes")),
            (2, 80_180),
            "{big:?}"
        );
        let bytes: u64 = rows.iter().map(|r| number(r, "bytes")).sum();
        assert_eq!(bytes, n("bytes"), "{layout:?}");
        seen.push(v["packets"].clone());
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
}

/// The records do not depend on how the input is read (one worker or several, each worker
/// reading for itself, one reader thread for all, or the workers reading the file's chunks
/// in turn: 30,000 packets make a dozen chunks) nor on whether the flow tables grow or
/// start full size.
#[test]
fn every_reading_layout_gives_the_same_records() {
    let pcap = tmp("layouts.pcap");
    generate(30_000, 4, &pcap);
    let csv = |layout: &[&str], name: &str| sorted_records(&pcap, layout, name);
    let one = csv(&["--workers", "1", "--read-ahead", "off"], "layout-1.csv");
    assert!(one.len() > 1000, "{} records", one.len());
    for (layout, name) in [
        (
            &["--workers", "1", "--read-ahead", "on"][..],
            "layout-1-on.csv",
        ),
        (
            &["--workers", "2", "--read-ahead", "off"][..],
            "layout-2-off.csv",
        ),
        (
            &["--workers", "2", "--read-ahead", "on"][..],
            "layout-2-on.csv",
        ),
        (&["--workers", "3"][..], "layout-3.csv"),
        (
            &["--workers", "1", "--read-ahead", "chunks"][..],
            "layout-1-chunks.csv",
        ),
        (
            &["--workers", "2", "--read-ahead", "chunks"][..],
            "layout-2-chunks.csv",
        ),
        (
            &["--workers", "2", "--presize-flows"][..],
            "layout-presized.csv",
        ),
    ] {
        assert_eq!(csv(layout, name), one, "{layout:?}");
    }
}

/// The default features make the same records whether or not the run also asks for the
/// extremes (the flow tables keep only totals when it does not), and the extremes are
/// real when asked for: each within its flow's bounds.
#[test]
fn extremes_are_kept_when_asked_for_and_the_rest_is_the_same() {
    let pcap = tmp("extremes.pcap");
    generate(30_000, 6, &pcap);
    let run = |features: &str, name: &str| {
        let out = tmp(name);
        ok(bin()
            .args(["flows", "--hash-seed", "1", "--features", features, "-i"])
            .arg(&pcap)
            .arg("--csv")
            .arg(&out)
            .output()
            .unwrap());
        let mut rows = csv_rows(&out);
        rows.sort_by_key(|r| format!("{r:?}"));
        rows
    };
    let totals = run("default", "extremes-default.csv");
    let all = run("default,ttl,sizes,iat", "extremes-all.csv");
    assert!(totals.len() > 1000, "{} records", totals.len());
    let mut defaults_of_all: Vec<_> = all
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.retain(|column, _| totals[0].contains_key(column));
            r
        })
        .collect();
    defaults_of_all.sort_by_key(|r| format!("{r:?}"));
    assert_eq!(defaults_of_all, totals);
    let mut several_packets = 0;
    for r in &all {
        let n = |c| number(r, c);
        assert!(1 <= n("ttl_min") && n("ttl_min") <= n("ttl_max"), "{r:?}");
        assert!(20 <= n("len_min") && n("len_min") <= n("len_mean"), "{r:?}");
        assert!(n("len_mean") <= n("len_max"), "{r:?}");
        if n("packets") > 1 {
            several_packets += 1;
            assert!(n("iat_min_ns") <= n("iat_mean_ns"), "{r:?}");
            assert!(n("iat_mean_ns") <= n("iat_max_ns"), "{r:?}");
            let span_ns = (n("end_ms") - n("start_ms") + 1) * 1_000_000;
            assert!(n("iat_max_ns") <= span_ns, "{r:?}");
        }
    }
    assert!(several_packets > all.len() / 4, "{several_packets}");
}

/// `-i -` reads standard input (a pipe from tcpdump): the same records as from the file,
/// with one worker or two; layouts that would read it more than once are refused.
#[test]
fn standard_input_gives_the_same_records_as_the_file() {
    let pcap = tmp("stdin.pcap");
    generate(20_000, 6, &pcap);
    let from_file = sorted_records(&pcap, &[], "stdin-file.csv");
    assert!(from_file.len() > 500, "{} records", from_file.len());
    for workers in ["1", "2"] {
        let out = tmp(&format!("stdin-{workers}.csv"));
        ok(bin()
            .args(["flows", "--hash-seed", "1", "--features", "all", "-i", "-"])
            .args(["--workers", workers, "--csv"])
            .arg(&out)
            .stdin(std::fs::File::open(&pcap).unwrap())
            .output()
            .unwrap());
        assert_eq!(sorted_lines(&out), from_file, "{workers} workers");
    }
    for (layout, message) in [
        ("off", "standard input can be read once: use auto or on"),
        ("chunks", "not standard input"),
    ] {
        let args = ["flows", "-i", "-", "--workers", "2", "--read-ahead", layout];
        refused(&[&args[..], &["--csv", "-"]].concat(), message);
    }
    let twice = ["flows", "-i", "-", "-i", "-", "--csv", "-"];
    refused(&twice, "standard input is given more than once");
}

#[test]
fn flows_settings_errors_name_the_key_or_flag() {
    let trace = tmp("errors.pcap");
    generate(100, 1, &trace);
    let run_with = |flows: &str| {
        let cfg = tmp("errors.toml");
        std::fs::write(
            &cfg,
            format!("[[port]]\nname = \"in\"\nrx = \"errors.pcap\"\n[flows]\n{flows}\n"),
        )
        .unwrap();
        let out = bin().args(["run", "-c"]).arg(&cfg).output().unwrap();
        assert!(!out.status.success(), "{flows}: refused");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run_with("csv = \"x.csv\"\nmax_flows = 0");
    assert!(err.contains("flows.max_flows: 0 is outside"), "{err}");
    let err = run_with("csv = \"x.csv\"\nfeatures = \"counts,colour\"");
    assert!(
        err.contains("flows.features") && err.contains("colour"),
        "{err}"
    );
    let err = run_with("csv = \"x.csv\"\nmtu = 70000");
    assert!(
        err.contains("mtu = 70000") && err.contains("from 512 to 65535"),
        "{err}"
    );
    let err = run_with("csv = \"x.csv\"\nipfix_rate = \"fast\"");
    assert!(
        err.contains("ipfix_rate") && err.contains("neither auto nor bytes per second"),
        "{err}"
    );
    let err = run_with("netflow9 = [\"127.0.0.1:2055\"]\nfeatures = \"all,iat\"");
    assert!(
        err.contains("flows.features: `iat` has no NetFlow v9 field")
            && err.contains("a flows.netflow9 collector"),
        "{err}"
    );
    let err = run_with("csv = \"x.csv\"\nidle_timeout = 3");
    assert!(err.contains("idle_timeout"), "{err}");
    let err = run_with("inactive_timeout = 3");
    assert!(
        err.contains("no sink") && err.contains("flows.csv"),
        "{err}"
    );
    let out = bin()
        .args(["flows", "--csv", "-", "--inactive-timeout", "0", "-i"])
        .arg(&trace)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--inactive-timeout: 0 is not a positive number"),
        "{err}"
    );
    // A missing input or interface is refused before any sink starts: no CSV file with a
    // header and nothing else is left behind.
    for (flag, name) in [("-i", "no-such-trace.pcap"), ("-I", "nosuchif0")] {
        let csv = tmp(&format!("orphan{flag}.csv"));
        let out = bin()
            .args(["flows", flag, name, "--csv"])
            .arg(&csv)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}");
        assert!(err.contains(name), "{err}");
        assert!(!csv.exists(), "{} was written", csv.display());
    }
    // The capture ring's size: a size in range, and only for interfaces.
    for bad in ["64x", "500k", "2G"] {
        refused(
            &["flows", "-I", "lo", "--csv", "-", "--capture-buffer", bad],
            &format!("--capture-buffer <BYTES>': '{bad}' is not a number of bytes from 1M to 1G"),
        );
    }
    let trace_path = trace.to_string_lossy();
    refused(
        &[
            "flows",
            "-i",
            &trace_path,
            "--csv",
            "-",
            "--capture-buffer",
            "8M",
        ],
        "--capture-buffer sizes the ring of a capture on an interface (--iface)",
    );
    // `stateplane run` sizes a monitor's ring too (flag or key), and only a monitor's.
    let cfg = tmp("capture.toml");
    for (value, message) in [
        ("\"2G\"", "'2G' is not a number of bytes from 1M to 1G"),
        (
            "\"8M\"",
            "sizes the ring of a passive monitor, a live run with --io observe",
        ),
    ] {
        std::fs::write(
            &cfg,
            format!("capture_buffer = {value}\n[[port]]\nname = \"in\"\nrx = \"errors.pcap\"\n"),
        )
        .unwrap();
        refused(&["run", "-c", &cfg.to_string_lossy()], message);
    }
    refused(
        &["run", "-I", "lo", "--capture-buffer", "8M"],
        "sizes the ring of a passive monitor, a live run with --io observe",
    );
    // bench-flows refuses a bad size at once, before it generates its traces.
    refused(
        &["bench-flows", "--slots", "64,100"],
        "--slots: 100 is not a power of two (e.g. 128)",
    );
}

/// Writes TCP connections as a capture: `closes` closed by FIN from both sides, the
/// client's final ACK `final_ack_ms` after the server's FIN (its last one `late` seconds
/// later instead), and `resets` reset by the client. Each connection: SYN, SYN-ACK, ACK,
/// two data segments down, then its close; connections start 0.1 s apart.
fn write_closes(path: &Path, closes: u16, late: u16, resets: u16, final_ack_ms: u64) {
    use stateplane_gen::build::{L4, emit_frame};
    use stateplane_io::pcap::PcapWriter;
    const SYN: u8 = 0x02;
    const FIN: u8 = 0x01;
    const RST: u8 = 0x04;
    const ACK: u8 = 0x10;
    let mut frames: Vec<(u64, Vec<u8>)> = Vec::new();
    for c in 0..closes + late + resets {
        let (client, server) = common::client_and_server();
        let port = 10_000 + c;
        let up = |flags, seq| L4::Tcp {
            src_port: port,
            dst_port: 80,
            seq,
            ack: 1,
            flags,
        };
        let down = |flags, seq| L4::Tcp {
            src_port: 80,
            dst_port: port,
            seq,
            ack: 1,
            flags,
        };
        let start = u64::from(c) * 100_000_000;
        let ms = 1_000_000;
        let mut packets = vec![
            (start, client, up(SYN, 0)),
            (start + ms, server, down(SYN | ACK, 0)),
            (start + 2 * ms, client, up(ACK, 1)),
            (start + 3 * ms, server, down(ACK, 1)),
            (start + 4 * ms, server, down(ACK, 1001)),
        ];
        if c >= closes + late {
            packets.push((start + 5 * ms, client, up(RST | ACK, 1)));
        } else {
            let ack_at = if c < closes {
                start + 6 * ms + final_ack_ms * ms
            } else {
                start + 6 * ms + 5_000 * ms
            };
            packets.push((start + 5 * ms, client, up(FIN | ACK, 1)));
            packets.push((start + 6 * ms, server, down(FIN | ACK, 2001)));
            packets.push((ack_at, client, up(ACK, 2)));
        }
        for (ts, hosts, l4) in packets {
            let mut frame = Vec::new();
            emit_frame(&mut frame, &hosts, &l4, &[0; 10]);
            frames.push((ts, frame));
        }
    }
    frames.sort_by_key(|(ts, _)| *ts);
    let mut w = PcapWriter::new(std::fs::File::create(path).unwrap(), true).unwrap();
    for (ts, frame) in &frames {
        w.write(*ts, frame, frame.len() as u32).unwrap();
    }
    w.flush().unwrap();
}

/// A connection closed by FIN is one record each way (one biflow), the client's final ACK
/// included: it comes within the FIN timeout. One that comes later, or with no FIN
/// timeout, is a record of its own; a reset ends its flow at once.
#[test]
fn a_fin_close_is_one_record_with_its_final_ack() {
    let trace = tmp("closes.pcap");
    let (closes, late, resets) = (300, 20, 50);
    write_closes(&trace, closes, late, resets, 40);
    let records = |flags: &[&str], name: &str| {
        let csv = tmp(name);
        ok(bin()
            .args(["flows", "--features", "default,end_reason", "-i"])
            .arg(&trace)
            .args(flags)
            .arg("--csv")
            .arg(&csv)
            .output()
            .unwrap());
        let rows = csv_rows(&csv);
        let packets: u64 = rows.iter().map(|r| number(r, "packets")).sum();
        let (opened, all) = (closes + late + resets, u64::from(closes + late + resets));
        if flags.contains(&"--biflow") {
            // Empty where the server never answered.
            let reverse: u64 = (rows.iter())
                .map(|r| r["rev_packets"].parse().unwrap_or(0))
                .sum();
            assert_eq!(packets + reverse, all * 6 + u64::from(closes + late) * 2);
        } else {
            assert_eq!(packets, all * 6 + u64::from(closes + late) * 2, "{name}");
        }
        let ended = rows.iter().filter(|r| r["end_reason"] == "end_of_flow");
        (rows.len(), ended.count(), usize::from(opened))
    };
    let (closes, late, resets) = (usize::from(closes), usize::from(late), usize::from(resets));
    let (rows, ended, _) = records(&[], "closes-default.csv");
    assert_eq!(rows, 2 * (closes + late + resets) + late, "uniflows");
    assert_eq!(
        ended,
        rows - late - resets,
        "ended by TCP: all but the late ACKs and the reset connections' server sides"
    );
    let (rows, ended, opened) = records(&["--biflow"], "closes-biflow.csv");
    assert_eq!(
        rows,
        opened + late,
        "one biflow a connection, and the late ACKs"
    );
    assert_eq!(ended, opened);
    let (rows, _, _) = records(&["--fin-timeout", "0"], "closes-no-timeout.csv");
    assert_eq!(rows, 2 * (closes + late + resets) + closes + late);
    let (rows, _, _) = records(&["--fin-timeout", "0", "--biflow"], "closes-biflow-0.csv");
    assert_eq!(rows, closes + late + resets + closes + late);
    refused(
        &[
            "flows",
            "-i",
            &trace.to_string_lossy(),
            "--csv",
            "-",
            "--fin-timeout=-1",
        ],
        "--fin-timeout: -1 is not a positive number of seconds (or 0 for none)",
    );
}

/// Records on standard output stay alone there: the run's summary, table or JSON, goes to
/// standard error instead, for `flows` and for a `run` with a `[flows]` section.
#[test]
fn records_on_stdout_are_not_mixed_with_the_summary() {
    let trace = tmp("stdout.pcap");
    generate(2_000, 3, &trace);
    let cfg = tmp("stdout.toml");
    std::fs::write(
        &cfg,
        "[[port]]\nname = \"in\"\nrx = \"stdout.pcap\"\n[flows]\ncsv = \"-\"\n",
    )
    .unwrap();
    let runs = [
        bin()
            .args(["flows", "--csv", "-", "--summary-json", "-i"])
            .arg(&trace)
            .output()
            .unwrap(),
        bin()
            .args(["flows", "--csv", "-", "-i"])
            .arg(&trace)
            .output()
            .unwrap(),
        bin().args(["run", "-c"]).arg(&cfg).output().unwrap(),
        bin()
            .args(["run", "--json", "-c"])
            .arg(&cfg)
            .output()
            .unwrap(),
    ];
    for out in runs {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut lines = stdout.lines();
        let columns = lines.next().unwrap().split(',').count();
        let mut records = 0;
        for line in lines {
            assert_eq!(line.split(',').count(), columns, "not a record: {line}");
            records += 1;
        }
        assert!(records > 100, "{records} records");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("records") || stderr.contains("flow records"),
            "the summary is on standard error: {stderr}"
        );
    }
}

/// `bench-flows` runs every experiment on a small trace, and its aggregator variants,
/// the one keeping only the totals among them, end the same flows (the command fails
/// otherwise) at a measured, positive rate.
#[test]
fn bench_flows_variants_agree_on_a_small_trace() {
    let csv = tmp("bench-flows.csv");
    ok(bin()
        .args([
            "bench-flows",
            "--workloads",
            "internet",
            "--packets",
            "20000",
        ])
        .args(["--slots", "64", "--repeat", "1", "--csv"])
        .arg(&csv)
        .output()
        .unwrap());
    let text = std::fs::read_to_string(&csv).unwrap();
    // A row whose kind never occurred (a table that never doubled) is left out, not NaN.
    assert!(!text.contains("NaN"), "{text}");
    let totals: Vec<&str> = text.lines().filter(|l| l.contains("totals only")).collect();
    assert_eq!(totals.len(), 1, "{text}");
    let rate: f64 = totals[0]
        .split(',')
        .find_map(|field| field.parse().ok())
        .unwrap();
    assert!(rate > 0.0, "{}", totals[0]);
    // The scaling rows: the rounds' ratio, measured, and the shards' balance, which for
    // two shards of one trace lies between 1x and 2x.
    let scaling: Vec<f64> = (text.lines())
        .filter(|l| l.starts_with("scaling,") && l.ends_with(",x"))
        .filter_map(|l| l.split(',').rev().nth(1)?.parse().ok())
        .collect();
    assert_eq!(scaling.len(), 2, "{text}");
    assert!(scaling[0] > 0.0, "{text}");
    assert!((1.0..=2.0).contains(&scaling[1]), "{text}");
}

/// `bench-flow-model`: the model's Table 5 figures (Equation 1) as the paper prints them,
/// and the microflow table measured within 10% of the exact expectation for uniform flows
/// (half the model's bound); Equation 2's rows rise with the new flows' share.
#[test]
fn bench_flow_model_puts_turboflow_beside_the_table() {
    let csv = tmp("flow-model.csv");
    ok(bin()
        .args(["bench-flow-model", "--packets", "400000", "--csv"])
        .arg(&csv)
        .output()
        .unwrap());
    let rows = csv_rows(&csv);
    assert_eq!(rows.len(), 8);
    let f = |r: &BTreeMap<String, String>, c: &str| r[c].parse::<f64>().unwrap();
    // Table 5: .65 (1 - 1/e here, with T = a = 4096), .40, .28, .22, .18.
    for (r, paper) in rows.iter().zip([0.632, 0.40, 0.28, 0.22, 0.18]) {
        assert!((f(r, "model_eviction") - paper).abs() < 0.01, "{r:?}");
        let (measured, exact) = (
            f(r, "measured_records_per_packet"),
            f(r, "exact_records_per_packet"),
        );
        assert!((measured / exact - 1.0).abs() < 0.1, "{r:?}");
        assert!(
            measured < f(r, "model_records_per_packet"),
            "the model is a bound"
        );
    }
    let churn: Vec<f64> = rows[5..]
        .iter()
        .map(|r| f(r, "measured_records_per_packet"))
        .collect();
    assert!(churn.windows(2).all(|w| w[0] < w[1]), "{churn:?}");
    refused(
        &["bench-flow-model", "--slots", "1000"],
        "not a power of two",
    );
}

/// SIGINT mid-run: the flows of what was read are exported, the summary says what was
/// done, and the exit is 130, the status a shell gives a command a SIGINT ended (it exited
/// 130 with no summary and no records).
#[test]
fn an_interrupt_exports_what_was_read_then_exits_130() {
    let trace = tmp("interrupted.pcap");
    generate(200_000, 7, &trace);
    let csv = tmp("interrupted.csv");
    let csv_arg = csv.to_string_lossy().to_string();
    let out = interrupted_mid_input(
        &["flows", "--summary-json", "-i", "-", "--csv", &csv_arg],
        &std::fs::read(&trace).unwrap(),
    );
    let summary: serde_json::Value =
        serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let packets = summary["packets"].as_u64().unwrap();
    assert!(
        packets > 0 && packets < 200_000,
        "stopped mid-way: {summary}"
    );
    let rows = csv_rows(&csv);
    assert_eq!(summary["records_exported"], rows.len() as u64, "{summary}");
    let counted: u64 = rows.iter().map(|r| number(r, "packets")).sum();
    assert_eq!(counted, packets, "every packet read is in a record");
}

/// `flows --metrics` serves what its summary says while it runs and, with
/// `--hold-metrics`, after: the packets read, the records taken from the workers and each
/// sink's lines, in a text Prometheus' checker takes; `--hold-metrics` alone is refused.
#[test]
fn flows_serves_its_counts_as_metrics() {
    let input = tmp("flows-metrics.pcap");
    generate(5000, 3, &input);
    let csv = tmp("flows-metrics.csv");
    let port = 20_000 + (std::process::id() % 20_000) as u16 + 2;
    let metrics = format!("127.0.0.1:{port}");
    let mut run = bin();
    run.args(["flows", "--metrics", &metrics, "--hold-metrics", "20"]);
    run.arg("--csv").arg(&csv).arg("-i").arg(&input);
    // The CSV has its last line once the run is over and the counts are final.
    let rows = || std::fs::read_to_string(&csv).map_or(0, |t| t.lines().count().saturating_sub(1));
    let text = &common::metrics_of_held_run(&mut run, port, |b| {
        let records = common::sum_of(b, "stateplane_flow_records_total");
        records > 0 && records == rows() as u64
    });
    // No ports, tables, rules or control API in a flow monitor over files.
    let elsewhere = ["port_", "table_", "cache_", "control_"].map(|p| format!("stateplane_{p}"));
    common::assert_scrape_sound(text, |f| !elsewhere.iter().any(|p| f.starts_with(p)));
    assert_eq!(common::sum_of(text, "stateplane_rx_packets_total"), 5000);
    let records = common::sum_of(text, "stateplane_flow_records_total");
    assert_eq!(records, csv_rows(&csv).len() as u64, "{text}");
    assert_eq!(
        common::sum_of(text, "stateplane_flow_export_records_total"),
        records
    );
    refused(
        &[
            "flows",
            "--hold-metrics",
            "5",
            "--csv",
            "-",
            "-i",
            input.to_str().unwrap(),
        ],
        "--hold-metrics keeps the metrics endpoint up after the run: give --metrics ADDR too",
    );
    refused(
        &[
            "run",
            "forward",
            "--hold-metrics",
            "5",
            "-i",
            input.to_str().unwrap(),
        ],
        "--hold-metrics keeps the metrics endpoint up after the run: give --metrics ADDR",
    );
    // On interfaces the endpoint lives as long as the capture: nothing to hold.
    let on_lo = [
        "--metrics",
        &metrics,
        "--hold-metrics",
        "5",
        "--csv",
        "-",
        "-I",
        "lo",
    ];
    refused(
        &[&["flows"][..], &on_lo].concat(),
        "--hold-metrics is for runs over capture files",
    );
}

/// The `stateplane flows` examples of docs/cli.md run as written, in a folder holding the
/// captures they name (`trace.pcap`, `a.pcap`, `b.pcap`), with a UDP collector listening
/// at the address the first gives: each succeeds, and the collector receives IPFIX.
#[test]
fn the_flows_examples_of_the_docs_run_as_written() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/cli.md"),
    )
    .unwrap();
    let examples: Vec<&str> = (doc.lines())
        .filter_map(|l| l.strip_prefix("    stateplane flows "))
        .map(|l| l.split("  #").next().unwrap_or(l).trim_end())
        .collect();
    assert!(examples.len() >= 2, "{examples:?}");
    let dir = common::tmp_dir("flows-examples");
    for (name, seed) in [("trace.pcap", 1), ("a.pcap", 2), ("b.pcap", 3)] {
        generate(3000, seed, &dir.join(name));
    }
    let collector = std::net::UdpSocket::bind("127.0.0.1:4739").expect("127.0.0.1:4739 is free");
    collector
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    for example in examples {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{} flows {example}",
                env!("CARGO_BIN_EXE_stateplane")
            ))
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{example}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut datagram = [0u8; 65_535];
    let (len, _) = collector
        .recv_from(&mut datagram)
        .expect("IPFIX reached the collector");
    assert!(
        len > 16 && datagram[..2] == [0, 10],
        "an IPFIX message (version 10)"
    );
}
