//! The lab and live ports end to end, as root: real namespaces, veth pairs, `stateplane`
//! switches on AF_PACKET, and real traffic (ping, ARP, iperf3, a byte-exact TCP transfer).
//! Each test makes its own lab, under its own name, and removes it even when it fails.
//! Every traffic command is bounded in count and time. Tools are installed by
//! scripts/test.sh; their absence fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::bin;
use stateplane_control::endpoint::RUN_DIR_VAR;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Duration;

/// One lab at a time: they share two cores, and the failover timing wants a quiet machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn topologies() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topologies")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn require(tool: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool} || test -x /usr/sbin/{tool}"))
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{tool} is not installed: run scripts/test.sh, which installs it"
    );
}

/// A running lab made from a shipped topology under a name of its own; `Drop` takes it
/// down whatever happened.
struct Lab {
    file: PathBuf,
    name: String,
    /// h2's address: where the transfers and iperf3 go.
    server: &'static str,
}

impl Lab {
    fn up(topology: &str, name: &str) -> Lab {
        Lab::up_with(topology, name, None)
    }

    /// With `io`, every switch uses that kind of live port (afpacket or afxdp).
    fn up_with(topology: &str, name: &str, io: Option<&str>) -> Lab {
        Lab::up_edited(topology, name, io, |t| t)
    }

    /// With the topology's text changed by `edit` first.
    fn up_edited(
        topology: &str,
        name: &str,
        io: Option<&str>,
        edit: impl Fn(String) -> String,
    ) -> Lab {
        for t in ["ip", "ethtool", "ping", "iperf3", "python3"] {
            require(t);
        }
        let original = std::fs::read_to_string(topologies().join(topology)).unwrap();
        // The lab's own name is the first `name = ` line; nodes' names come after it.
        let mut renamed = false;
        let renamed: String = original
            .lines()
            .map(|l| {
                if l.starts_with("name = ") && !renamed {
                    renamed = true;
                    format!("name = \"{name}\"")
                } else {
                    l.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let renamed = edit(renamed);
        let renamed = match io {
            Some(io) => renamed.replace(
                "[switch.program]\n",
                &format!("io = \"{io}\"\n[switch.program]\n"),
            ),
            None => renamed,
        };
        let dir = common::tmp_dir("lab");
        let file = dir.join(format!("{name}.toml"));
        std::fs::write(&file, renamed).unwrap();
        let lab = Lab {
            file,
            name: name.to_owned(),
            server: "198.18.0.2",
        };
        let _ = lab.cmd(&["down"]); // a previous crashed run's leftovers
        let out = lab.cmd(&["up"]);
        assert!(out.status.success(), "lab up failed:\n{}", text(&out));
        if let Some(io) = io {
            let log = std::fs::read_to_string(lab_file(&lab, "s1.log")).unwrap();
            let kind = if io == "afxdp" { "AF_XDP" } else { "AF_PACKET" };
            assert!(
                log.contains(&format!("p0: {kind}")),
                "s1 uses {kind}:\n{log}"
            );
        }
        lab
    }

    fn cmd(&self, args: &[&str]) -> Output {
        let (action, rest) = args.split_first().unwrap();
        bin()
            .args(["lab", action])
            .arg(&self.file)
            .args(rest)
            .output()
            .unwrap()
    }

    /// Runs a command in a node's namespace.
    fn exec(&self, node: &str, command: &[&str]) -> Output {
        let ns = format!("sp-{}-{node}", self.name);
        Command::new("ip")
            .args(["netns", "exec", &ns])
            .env(RUN_DIR_VAR, run_dir_of(&ns))
            .args(command)
            .output()
            .unwrap()
    }

    fn namespaces(&self) -> Vec<String> {
        let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with(&format!("sp-{}-", self.name)))
            .map(str::to_owned)
            .collect()
    }

    /// Packets received by `iface` in `node` (the kernel's interface counter).
    fn rx_packets(&self, node: &str, iface: &str) -> u64 {
        let out = self.exec(
            node,
            &[
                "cat",
                &format!("/sys/class/net/{iface}/statistics/rx_packets"),
            ],
        );
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    fn switch_pid(&self, node: &str) -> u32 {
        let dir = std::env::var_os("STATEPLANE_LAB_DIR")
            .map_or_else(|| PathBuf::from("/run/stateplane/lab"), PathBuf::from);
        std::fs::read_to_string(dir.join(&self.name).join(format!("{node}.pid")))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let out = self.cmd(&["down"]);
        if !std::thread::panicking() {
            assert!(out.status.success(), "lab down failed:\n{}", text(&out));
            assert!(self.namespaces().is_empty(), "lab down left namespaces");
        }
    }
}

/// ARP resolves through the switch (h1 learns h2's MAC) and ICMP echo gets every reply,
/// both ways, the second time after a fresh ARP exchange.
fn arp_and_icmp(lab: &Lab) {
    let out = lab.exec(
        "h1",
        &["ping", "-c", "5", "-i", "0.2", "-W", "2", "198.18.0.2"],
    );
    assert!(out.status.success(), "ping failed:\n{}", text(&out));
    assert!(
        text(&out).contains("5 received"),
        "every echo is answered:\n{}",
        text(&out)
    );
    let neigh = lab.exec("h1", &["ip", "neigh", "show", "198.18.0.2"]);
    assert!(
        text(&neigh).contains("02:00:00:00:01:02"),
        "h1 resolved h2 by ARP through the switch: {}",
        text(&neigh)
    );
    let _ = lab.exec("h2", &["ip", "neigh", "flush", "dev", "eth0"]);
    let out = lab.exec(
        "h2",
        &["ping", "-c", "3", "-i", "0.2", "-W", "2", "198.18.0.1"],
    );
    assert!(text(&out).contains("3 received"), "{}", text(&out));
}

#[test]
fn forward_carries_arp_and_icmp_over_afpacket_and_afxdp() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (io, name) in [("afpacket", "tfwdp"), ("afxdp", "tfwdx")] {
        let lab = Lab::up_with("line.toml", name, Some(io));
        arp_and_icmp(&lab);
        // The controller is reachable from the switch on the management network.
        let out = lab.exec("s1", &["ping", "-c", "1", "-W", "2", "198.19.255.1"]);
        assert!(text(&out).contains("1 received"), "{}", text(&out));
        // The switch's metrics, on its own loopback, count the traffic per port too.
        std::thread::sleep(Duration::from_millis(300));
        let metrics = metric_lines(&lab, "s1");
        let value = |name: &str| -> u64 {
            let line = metrics.lines().find(|l| l.starts_with(name));
            line.and_then(|l| l.split_whitespace().last()?.parse().ok())
                .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
        };
        // Prometheus' checker takes a live switch's text too (ports, tables, bounds).
        common::assert_scrape_sound(&metrics, |f| f.starts_with("stateplane_port_"));
        assert!(
            common::sum_of(&metrics, "stateplane_rx_packets_total") >= 16,
            "{metrics}"
        );
        assert!(
            value("stateplane_port_rx_packets_total{port=\"p0\"}") >= 8,
            "{metrics}"
        );
        assert!(
            value("stateplane_port_tx_packets_total{port=\"p1\"}") >= 8,
            "{metrics}"
        );
    }
}

/// `l2` (static table, flooding the unknown) over both kinds of port, and `l2learn`.
#[test]
fn l2_and_l2learn_carry_arp_and_icmp() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (topology, io, name) in [
        ("line-l2.toml", Some("afpacket"), "tl2p"),
        ("line-l2.toml", Some("afxdp"), "tl2x"),
        ("line-learn.toml", None, "tlearn"),
    ] {
        let lab = Lab::up_with(topology, name, io);
        arp_and_icmp(&lab);
    }
}

/// Sends `bytes` pseudo-random bytes over one TCP connection from h1 to h2 and returns what
/// each side counted and hashed (python3: a byte-exact check that iperf3 does not make).
fn exact_transfer(lab: &Lab, bytes: usize, port: u16) -> (String, String) {
    let (sent, received, _) = exact_transfer_from(lab, bytes, port);
    (sent, received)
}

/// As [`exact_transfer`], also giving the client's address as the server saw it.
fn exact_transfer_from(lab: &Lab, bytes: usize, port: u16) -> (String, String, String) {
    let addr = lab.server;
    let server = format!(
        "import socket,hashlib\n\
         s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('{addr}',{port})); s.listen(1); s.settimeout(30)\n\
         c,peer=s.accept(); c.settimeout(30); h=hashlib.sha256(); n=0\n\
         while True:\n    b=c.recv(65536)\n    if not b: break\n    h.update(b); n+=len(b)\n\
         print(n, h.hexdigest()); print(peer[0])"
    );
    let client = format!(
        "import socket,hashlib,random\n\
         data=random.Random(7).randbytes({bytes})\n\
         c=socket.create_connection(('{addr}',{port}),timeout=30); c.sendall(data); c.close()\n\
         print(len(data), hashlib.sha256(data).hexdigest())"
    );
    let ns = format!("sp-{}-h2", lab.name);
    let srv = Command::new("ip")
        .args([
            "netns", "exec", &ns, "timeout", "60", "python3", "-c", &server,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let sent = lab.exec("h1", &["timeout", "60", "python3", "-c", &client]);
    // The client prints only once it has sent everything: an empty line is a failure,
    // never a match for an empty line from the server.
    assert!(
        String::from_utf8_lossy(&sent.stdout).starts_with(&format!("{bytes} ")),
        "the client did not send its {bytes} bytes:\n{}",
        text(&sent)
    );
    let received = srv.wait_with_output().unwrap();
    let received = String::from_utf8_lossy(&received.stdout);
    let mut lines = received.lines();
    (
        String::from_utf8_lossy(&sent.stdout).trim().to_owned(),
        lines.next().unwrap_or("").trim().to_owned(),
        lines.next().unwrap_or("").trim().to_owned(),
    )
}

/// Runs iperf3 from h1 to h2 with `limit` (`-n BYTES` or `-t SECONDS`, and any other
/// client flags) over `streams` connections, calling `during` while it runs; returns the
/// client's JSON report after checking that it completed.
fn iperf3(lab: &Lab, limit: &[&str], streams: u32, during: impl FnOnce()) -> serde_json::Value {
    let out = iperf3_client(lab, limit, streams, 90, during);
    assert!(
        out.status.success(),
        "iperf3 did not complete:\n{}",
        text(&out)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// As [`iperf3`], the client stopped after `timeout_s` seconds, its output whatever it is.
fn iperf3_client(
    lab: &Lab,
    limit: &[&str],
    streams: u32,
    timeout_s: u32,
    during: impl FnOnce(),
) -> Output {
    let out = lab.exec("h2", &["iperf3", "-s", "-1", "-D", "-B", lab.server]);
    assert!(out.status.success(), "iperf3 server: {}", text(&out));
    std::thread::sleep(Duration::from_millis(300));
    let ns = format!("sp-{}-h1", lab.name);
    let client = Command::new("ip")
        .args(["netns", "exec", &ns, "timeout", &timeout_s.to_string()])
        .args(["iperf3", "-c", lab.server])
        .args(limit)
        .args(["-P", &streams.to_string(), "-J"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    during();
    client.wait_with_output().unwrap()
}

fn mib(n: u64) -> u64 {
    n << 20
}

#[test]
fn tcp_through_the_switch_delivers_every_byte_over_afpacket() {
    tcp_delivers_every_byte("afpacket", "ttcpp");
}

#[test]
fn tcp_through_the_switch_delivers_every_byte_over_afxdp() {
    tcp_delivers_every_byte("afxdp", "ttcpx");
}

fn tcp_delivers_every_byte(io: &str, name: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up_with("line.toml", name, Some(io));
    let report = iperf3(&lab, &["-n", "200M"], 1, || {});
    let sent = report["end"]["sum_sent"]["bytes"].as_u64().unwrap();
    // iperf3 may overshoot `-n` by up to one 128 KiB write.
    assert!(
        (mib(200)..=mib(200) + (128 << 10)).contains(&sent),
        "iperf3 sent the whole transfer: {sent}"
    );
    let received = report["end"]["sum_received"]["bytes"].as_u64().unwrap();
    // iperf3's receiver stops counting at the end-of-test message, so bytes still in
    // flight then are missing from its total; the exact check follows.
    assert!(received > sent * 9 / 10, "received {received} of {sent}");
    let (sent, received) = exact_transfer(&lab, 20 << 20, 5301);
    assert!(
        sent.starts_with(&format!("{} ", 20 << 20)),
        "client: {sent}"
    );
    assert_eq!(sent, received, "every byte arrives, in order, unchanged");
    // The receive rings held every burst TCP sent: what the kernel dropped at a full ring
    // the sender would have had to retransmit.
    let metrics = metric_lines(&lab, "s1");
    for port in ["p0", "p1"] {
        let drops = port_count(&metrics, "rx_kernel_drops", port);
        assert_eq!(drops, Some(0), "{port}:\n{metrics}");
    }
}

/// A live port's own count `name` for `port`, as the switch's `metrics` text has it.
fn port_count(metrics: &str, name: &str, port: &str) -> Option<u64> {
    let prefix = format!("stateplane_port_{name}_total{{port=\"{port}\"}} ");
    (metrics.lines())
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
}

/// Hosts that leave their TCP checksums for the device to finish (checksum offload on, a
/// veth's default) hand the switch partial checksums; it finishes them, so every byte
/// arrives (forwarded as they came, the receiver would drop every segment).
#[test]
fn tcp_from_hosts_that_leave_checksums_to_the_device_arrives_whole_over_afpacket() {
    tcp_with_partial_checksums_arrives_whole("afpacket", "tcsump");
}

#[test]
fn tcp_from_hosts_that_leave_checksums_to_the_device_arrives_whole_over_afxdp() {
    tcp_with_partial_checksums_arrives_whole("afxdp", "tcsumx");
}

fn tcp_with_partial_checksums_arrives_whole(io: &str, name: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up_with("line.toml", name, Some(io));
    for host in ["h1", "h2"] {
        let on = lab.exec(host, &["ethtool", "-K", "eth0", "tx", "on"]);
        assert!(on.status.success(), "{}", text(&on));
    }
    let (sent, received) = exact_transfer(&lab, 4 << 20, 5309);
    assert!(sent.starts_with(&format!("{} ", 4 << 20)), "client: {sent}");
    assert_eq!(sent, received, "every byte arrives, in order, unchanged");
    let metrics = metric_lines(&lab, "s1");
    for port in ["p0", "p1"] {
        let partial = port_count(&metrics, "rx_partial_checksum", port);
        assert!(partial > Some(100), "{port} finished checksums: {metrics}");
    }
}

/// Hosts and veths with their offloads on (a veth's default; the lab turns them off) hand
/// TCP over in large segments, above the MTU; an AF_PACKET switch carries them whole and
/// the kernel cuts them only where the next device needs it: every byte arrives, and the
/// segments were large.
#[test]
fn tcp_from_hosts_with_offloads_on_crosses_in_large_segments_over_afpacket() {
    let (lab, (sent, received, _)) = transfer_with_offloads_on("line.toml", "tlarge", true);
    assert_eq!(sent, received, "every byte arrives, in order, unchanged");
    large_segments_crossed(&lab);
}

/// The same through `nat`, which rewrites a large segment's addresses and ports, with
/// s1's p1 leaving checksums to software: the kernel cuts each segment and sums each
/// piece from what the switch left in its checksum field, and h2 checks every one (a
/// veth trusts a checksum left partial; this path does not).
#[test]
fn tcp_in_large_segments_through_nat_arrives_whole_from_the_external_address() {
    let (lab, (sent, received, peer)) = transfer_with_offloads_on("line-nat.toml", "tlnat", false);
    assert_eq!(sent, received, "every byte through nat");
    assert_eq!(peer, "198.18.0.100", "h2 sees the external address");
    large_segments_crossed(&lab);
}

/// Stops the switch the lab started on `node` (SIGTERM), and waits (bounded) until it is
/// gone.
fn stop_switch(lab: &Lab, node: &str) {
    let pid = lab.switch_pid(node).to_string();
    assert!(kill("-TERM", &pid));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while Path::new(&format!("/proc/{pid}")).exists() {
        let late = std::time::Instant::now() > deadline;
        assert!(!late, "{node}'s switch did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Turns the offloads on (checksums, TSO, GSO, GRO) at every end of line.toml's links.
fn offloads_on(lab: &Lab) {
    for (node, iface) in [("h1", "eth0"), ("s1", "p0"), ("s1", "p1"), ("h2", "eth0")] {
        let on = lab.exec(
            node,
            &[
                "ethtool", "-K", iface, "tx", "on", "tso", "on", "gso", "on", "gro", "on",
            ],
        );
        assert!(on.status.success(), "{}", text(&on));
    }
}

/// With `--io auto` (the default), a switch whose ports are veths with TSO on (a veth's
/// default) gives every port AF_PACKET, says why, and carries the hosts' large segments.
#[test]
fn auto_io_gives_veths_with_tso_on_af_packet_and_carries_their_large_segments() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up("line.toml", "tauto");
    // The lab's switch opened its ports with the offloads off; a second run opens them on.
    stop_switch(&lab, "s1");
    offloads_on(&lab);
    let ns = format!("sp-{}-s1", lab.name);
    let run = start_in(&ns, &["run", "--config"], &lab_file(&lab, "s1.toml"));
    let (sent, received, _) = exact_transfer_from(&lab, 8 << 20, 5312);
    let metrics = metric_lines(&lab, "s1");
    assert!(kill("-TERM", &run_of(&run)));
    let out = run.wait_with_output().unwrap();
    assert_eq!(sent, received, "every byte arrives");
    assert!(
        text(&out).contains("p0: a veth with TSO on")
            && text(&out).contains("every port gets AF_PACKET"),
        "{}",
        text(&out)
    );
    assert!(
        port_count(&metrics, "rx_large_segments", "p0") > Some(10),
        "{metrics}"
    );
}

/// A TCP segment above 64 KiB (BIG TCP: a sender whose `gso_max_size` is raised) is larger
/// than a burst of 8 holds: it is dropped, counted and named, and the port goes on
/// forwarding (waiting for a burst with room for it would have stopped the port for good).
#[test]
fn a_segment_above_64_kib_is_dropped_and_named_and_the_port_goes_on() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up_with("line.toml", "tbigtcp", Some("afpacket"));
    stop_switch(&lab, "s1");
    offloads_on(&lab);
    for (host, addr) in [("h1", "2001:db8::1/64"), ("h2", "2001:db8::2/64")] {
        let set = |args: &[&str]| {
            let out = lab.exec(host, args);
            assert!(out.status.success(), "{args:?}: {}", text(&out));
        };
        set(&["ip", "-6", "addr", "add", addr, "dev", "eth0", "nodad"]);
        set(&["ip", "link", "set", "eth0", "gso_max_size", "150000"]);
    }
    let config = lab_file(&lab, "s1.toml");
    let small_burst = lab_file(&lab, "s1-burst8.toml");
    let text_of = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&small_burst, format!("burst = 8\n{text_of}")).unwrap();
    let ns = format!("sp-{}-s1", lab.name);
    let run = start_in(&ns, &["run", "--config"], &small_burst);
    let server = lab.exec("h2", &["iperf3", "-s", "-1", "-D", "-B", "2001:db8::2"]);
    assert!(server.status.success(), "{}", text(&server));
    std::thread::sleep(Duration::from_millis(300));
    let _ = lab.exec(
        "h1",
        &[
            "timeout",
            "10",
            "iperf3",
            "-6",
            "-c",
            "2001:db8::2",
            "-t",
            "2",
        ],
    );
    let ping = lab.exec(
        "h1",
        &["ping", "-c", "3", "-i", "0.2", "-W", "2", "198.18.0.2"],
    );
    let metrics = metric_lines(&lab, "s1");
    assert!(kill("-TERM", &run_of(&run)));
    let out = run.wait_with_output().unwrap();
    assert!(text(&ping).contains("3 received"), "{}", text(&ping));
    assert!(
        port_count(&metrics, "rx_oversize", "p0") > Some(0),
        "{metrics}"
    );
    assert!(
        text(&out).contains("p0: dropped a ") && text(&out).contains("BIG TCP"),
        "{}",
        text(&out)
    );
}

/// Brings `topology` up on AF_PACKET with every host's and switch port's offloads on (but
/// s1's p1's checksum offload, and so its TSO, unless `p1_checksums`), and moves 8 MiB
/// from h1 to h2.
fn transfer_with_offloads_on(
    topology: &str,
    name: &str,
    p1_checksums: bool,
) -> (Lab, (String, String, String)) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up_with(topology, name, Some("afpacket"));
    offloads_on(&lab);
    if !p1_checksums {
        let off = lab.exec("s1", &["ethtool", "-K", "p1", "tx", "off"]);
        assert!(off.status.success(), "{}", text(&off));
    }
    let transfer = exact_transfer_from(&lab, 8 << 20, 5310);
    (lab, transfer)
}

/// The switch received large segments from h1 and sent every one on.
fn large_segments_crossed(lab: &Lab) {
    let metrics = metric_lines(lab, "s1");
    let count = |name: &str, port: &str| port_count(&metrics, name, port).unwrap_or(0);
    assert!(count("rx_large_segments", "p0") > 10, "{metrics}");
    assert_eq!(count("rx_oversize", "p0"), 0, "{metrics}");
    assert_eq!(count("tx_oversize", "p1"), 0, "{metrics}");
    assert_eq!(count("rx_kernel_drops", "p0"), 0, "{metrics}");
}

/// A frame above the MTU that is not a TCP segment (here UDP a sender left for its device
/// to cut, UDP GSO) is not carried: the switch says so in its log when the first comes,
/// with the fix, and counts them.
#[test]
fn frames_above_the_mtu_that_are_not_tcp_are_named_with_the_fix() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up_with("line.toml", "tbig", Some("afpacket"));
    let on = lab.exec(
        "h1",
        &[
            "ethtool",
            "-K",
            "eth0",
            "tx",
            "on",
            "gso",
            "on",
            "tx-udp-segmentation",
            "on",
        ],
    );
    assert!(on.status.success(), "{}", text(&on));
    // Three datagrams of 4,000 bytes, each to be cut into pieces of 1,000 (UDP_SEGMENT).
    let sender = "import socket\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.setsockopt(17,103,1000)\n\
         for _ in range(3): s.sendto(b'x'*4000,('198.18.0.2',5311))";
    let sent = lab.exec("h1", &["timeout", "10", "python3", "-c", sender]);
    assert!(sent.status.success(), "{}", text(&sent));
    // The switch logs the first as it drops it, and publishes its ports' counts every
    // 100 ms: both are read until they show it (bounded).
    let warned = |log: &str| {
        log.contains("p0: dropped a ")
            && log.contains("larger than its MTU (1500) allows")
            && log.contains("ethtool -K")
    };
    let log = read_until(
        || std::fs::read_to_string(lab_file(&lab, "s1.log")).unwrap_or_default(),
        warned,
    );
    assert!(warned(&log), "{log}");
    let counted = |metrics: &str| port_count(metrics, "rx_oversize", "p0") > Some(0);
    let metrics = read_until(|| metric_lines(&lab, "s1"), counted);
    assert!(counted(&metrics), "{metrics}");
}

/// Reads with `read` until `done` holds of what it gave, for at most 5 s; returns the last
/// reading.
fn read_until(mut read: impl FnMut() -> String, done: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let reading = read();
        if done(&reading) || std::time::Instant::now() > deadline {
            return reading;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn dual_moves_flows_to_the_survivor_when_a_switch_dies() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up("dual.toml", "tdual");
    // Wait (bounded) until the steering point sees both paths, then check the path.
    let out = lab.exec(
        "h1",
        &["ping", "-c", "3", "-i", "0.2", "-W", "2", "198.18.0.2"],
    );
    assert!(text(&out).contains("3 received"), "{}", text(&out));
    let mut killed = String::new();
    let mut before = (0, 0);
    // Eight connections for six seconds; the busier switch dies after two.
    let report = iperf3(&lab, &["-t", "6"], 8, || {
        std::thread::sleep(Duration::from_millis(2000));
        let (s1, s2) = (lab.rx_packets("s1", "p0"), lab.rx_packets("s2", "p0"));
        killed = if s1 >= s2 { "s1" } else { "s2" }.to_owned();
        before = (s1.min(s2), s1.max(s2));
        let pid = lab.switch_pid(&killed).to_string();
        assert!(kill("-KILL", &pid));
    });
    let survivor = if killed == "s1" { "s2" } else { "s1" };
    assert!(
        before.0 > 100,
        "both switches carried flows before the failure: {before:?}"
    );
    // Every connection, those that crossed the dead switch included, still moves data in
    // the last second: the flows moved.
    every_stream_moved_at_the_end(&report, 8, "the failure");
    let survivor_now = lab.rx_packets(survivor, "p0");
    assert!(
        survivor_now > before.1,
        "the survivor took the moved flows: {survivor_now} after, {before:?} before"
    );
    let status = text(&lab.cmd(&["status"]));
    assert!(
        status
            .lines()
            .any(|l| l.contains(&killed) && l.contains("stopped")),
        "status shows the dead switch:\n{status}"
    );
    // New connections take the survivor alone and still get through, byte for byte.
    let (sent, received) = exact_transfer(&lab, 4 << 20, 5302);
    assert_eq!(sent, received);
}

/// topologies/dual-firewall.toml: `firewall` on both parallel switches (inside toward h1),
/// their connections replicated to the controller's redis-server with a lease of
/// [`FAILOVER_LEASE_MS`]; unless `replicated` is false, which leaves their guarantees and
/// replication out.
fn dual_firewall(name: &str, replicated: bool) -> Lab {
    dual_switches("dual-firewall.toml", name, replicated)
}

/// A lab of two parallel switches behind `steer` from `topology` (as [`dual_firewall`]).
fn dual_switches(topology: &str, name: &str, replicated: bool) -> Lab {
    require("redis-server");
    Lab::up_edited(topology, name, None, |t| {
        let t = t.replace(
            "lease_ms = 1000",
            &format!("lease_ms = {FAILOVER_LEASE_MS}"),
        );
        if replicated {
            return t;
        }
        let mut in_replication = false;
        let kept: Vec<&str> = (t.lines())
            .filter(|l| {
                if l.starts_with('[') {
                    in_replication = matches!(*l, "[switch.guarantees]" | "[switch.replication]");
                }
                !in_replication
            })
            .collect();
        kept.join("\n")
    })
}

/// A transfer through `lab`'s replicated `program` survives the death of the switch
/// carrying it: iperf3 completes, moving data in its last second, and the survivor took
/// the connection's state from the store.
fn survived_the_death_of_its_switch(lab: &Lab, program: &str) {
    let (out, killed, survivor, _) = transfer_killing_its_switch(lab);
    assert!(
        out.status.success(),
        "the transfer survived {killed}'s death:\n{}\n{survivor}'s log:\n{}",
        text(&out),
        std::fs::read_to_string(lab_file(lab, &format!("{survivor}.log"))).unwrap_or_default()
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report.get("error").is_none(), "{report}");
    let bytes: Vec<u64> = (report["intervals"].as_array().unwrap().iter())
        .map(|i| i["sum"]["bytes"].as_u64().unwrap())
        .collect();
    let metrics = metric_lines(lab, &survivor);
    // Moving again, not crawling: a connection still in retransmission backoff sends a
    // segment per timeout, 200 ms and more apart, so data in at least 8 of the last ten
    // 100 ms intervals tells them apart and leaves room for one stall of a host whose
    // two cores the transfer saturates (its ends, three switches and the store).
    let last_second = &bytes[bytes.len().saturating_sub(10)..];
    let moving = last_second.iter().filter(|&&b| b > 0).count();
    assert!(
        last_second.len() == 10 && moving >= 8,
        "the connection moves data at the end: {bytes:?}\n{survivor}'s replication:\n{}",
        (metrics.lines())
            .filter(|l| l.starts_with("stateplane_replication"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!(
        "{program} failover with a {FAILOVER_LEASE_MS} ms lease: {} ms without data ({killed} killed)",
        bytes.iter().filter(|&&b| b == 0).count() * 100
    );
    let migrated: u64 = (metrics.lines())
        .find_map(|l| l.strip_prefix("stateplane_replication_migrated_total "))
        .unwrap_or_else(|| panic!("{metrics}"))
        .parse()
        .unwrap();
    assert!(
        migrated >= 1,
        "the survivor took the connection from the store: {metrics}"
    );
}

/// The lease of the failover tests' replicated switches.
const FAILOVER_LEASE_MS: u64 = 200;

/// iperf3 for six seconds over one connection through the dual firewall lab, giving up on
/// data unacknowledged for 3 s; the switch carrying it (the busier) is killed after two.
/// The client's output, the switch killed, the other, and the other's metrics just before
/// the kill.
fn transfer_killing_its_switch(lab: &Lab) -> (Output, String, String, String) {
    let out = lab.exec(
        "h1",
        &["ping", "-c", "3", "-i", "0.2", "-W", "2", "198.18.0.2"],
    );
    assert!(text(&out).contains("3 received"), "{}", text(&out));
    let (mut killed, mut at_kill) = (String::new(), String::new());
    let flags = ["-t", "6", "-i", "0.1", "--snd-timeout", "3000"];
    let out = iperf3_client(lab, &flags, 1, 30, || {
        std::thread::sleep(Duration::from_millis(2000));
        let (s1, s2) = (lab.rx_packets("s1", "p0"), lab.rx_packets("s2", "p0"));
        killed = if s1 >= s2 { "s1" } else { "s2" }.to_owned();
        assert!(s1.max(s2) > 1000, "the transfer is under way: {s1} {s2}");
        at_kill = metric_lines(lab, if s1 >= s2 { "s2" } else { "s1" });
        assert!(kill("-KILL", &lab.switch_pid(&killed).to_string()));
    });
    let survivor = if killed == "s1" { "s2" } else { "s1" }.to_owned();
    (out, killed, survivor, at_kill)
}

/// Whether the transfer of [`transfer_killing_its_switch`] died with its switch. iperf3
/// -J reports a connection it gave up on as an "error" in its JSON: "timed out" when its
/// data stalled past --snd-timeout, or a broken control connection ("unable to send
/// control message: Broken pipe") when that stalled first. On a loaded host the kill can
/// come late enough that the six seconds end before --snd-timeout does: then its data
/// stopped and never moved again, its last two seconds and more without any. (A
/// transfer that survives moves data in most of its last second.)
fn never_recovered(out: &Output) -> bool {
    let Ok(report) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return !out.status.success();
    };
    if !out.status.success() || report["error"].as_str().is_some() {
        return true;
    }
    let bytes = (report["intervals"].as_array().into_iter().flatten())
        .map(|i| i["sum"]["bytes"].as_u64().unwrap_or(0));
    let stalled_at_the_end = bytes.rev().take_while(|&b| b == 0).count();
    stalled_at_the_end >= 20
}

/// Behind `steer`, two `firewall` switches keep their connections replicated in Redis on
/// the controller. The switch carrying a TCP transfer is killed mid-transfer; the
/// steering point moves the connection to the other, which takes its state over from the
/// store once the dead one's lease has passed, and lets the server's answers in: the
/// transfer goes on to its end. Unreplicated, the survivor knows no such connection and
/// drops the server's answers as unsolicited: the transfer stalls and the client gives up.
#[test]
fn a_tcp_connection_survives_the_death_of_its_firewall_when_its_state_is_replicated() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = dual_firewall("tfwrep", true);
    survived_the_death_of_its_switch(&lab, "firewall");
    drop(lab);

    let lab = dual_firewall("tfwplain", false);
    let (out, killed, survivor, _) = transfer_killing_its_switch(&lab);
    assert!(
        never_recovered(&out),
        "unreplicated, the connection cannot survive {killed}'s death: {}",
        text(&out)
    );
    // The survivor knows nothing of the connection: it drops the server's answers as
    // `unsolicited` and the client's segments (no SYN) as `invalid`; which of the two
    // come depends on whose data was unacknowledged when the switch died.
    let (unsolicited, invalid) = (
        drops(&lab, &survivor, "unsolicited"),
        drops(&lab, &survivor, "invalid"),
    );
    assert!(
        unsolicited + invalid > 0,
        "{survivor} dropped none of the connection's packets for want of its state: \
         unsolicited {unsolicited}, invalid {invalid}"
    );
}

/// topologies/dual-nat.toml: behind a `steer` that chooses by the outside end, two `nat`
/// switches, each with a pool of its own, keep their translations replicated in Redis on
/// the controller. The switch carrying a TCP transfer is killed mid-transfer; the other
/// takes the translation over from the store (by the connection from the inside, or by
/// the alias of its answers from the outside, whichever comes first) and keeps
/// translating it to the same external port: the transfer goes on to its end.
/// Unreplicated, the survivor drops the server's answers (`no_translation`) and would send
/// the inside's packets out on a port of its own, which the server knows nothing of.
#[test]
fn a_tcp_connection_survives_the_death_of_its_nat_when_its_translation_is_replicated() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = dual_switches("dual-nat.toml", "tnatrep", true);
    survived_the_death_of_its_switch(&lab, "nat");
    drop(lab);

    let lab = dual_switches("dual-nat.toml", "tnatplain", false);
    let (out, killed, survivor, at_kill) = transfer_killing_its_switch(&lab);
    assert!(
        never_recovered(&out),
        "unreplicated, the connection cannot survive {killed}'s death: {}",
        text(&out)
    );
    // The survivor knows no translation of the connection: it drops the server's answers
    // (`no_translation`), or translates the client's segments to a port of its own, which
    // the server knows nothing of; which of the two it meets depends on what was on its
    // way when the switch died (the server's answers may all have gone to the dead one).
    let metrics = metric_lines(&lab, &survivor);
    let translations = "stateplane_table_adds_total{table=\"translations\"}";
    let made = metric(&metrics, translations) - metric(&at_kill, translations);
    let no_translation = metric(
        &metrics,
        "stateplane_drops_total{reason=\"no_translation\"}",
    );
    assert!(
        no_translation > 0 || made > 0,
        "{survivor} neither dropped the server's answers nor translated the client's \
         segments anew: {metrics}"
    );
}

/// topologies/dual-nat.toml with the translations `synced` to a collector on the
/// controller instead of replicated: mid-transfer, `ctl sync migrate` moves the
/// translations of the switch carrying the connection into the other (the collector reads
/// them from its copy and writes them in), and the carrying switch is killed; the
/// steering point moves the connection to the other, which translates it to the same
/// external port, from the dead switch's pool: the transfer goes on to its end. (Without
/// the move the survivor drops the server's answers and the client gives up: the nat
/// failover test's unreplicated half.)
#[test]
fn a_tcp_connection_moves_to_another_nat_through_sync_migrate() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up_edited("dual-nat.toml", "tnatsync", None, |t| {
        let mut t = t.to_owned();
        for id in 1..=2 {
            t = t.replace(
                &format!(
                    "translations = [\"replicated\"]\n[switch.replication]\n\
                     store = \"redis://198.19.255.1:6379/\"\nlease_ms = 1000\nswitch = {id}"
                ),
                &format!(
                    "translations = [\"synced\"]\n[switch.sync]\n\
                     collector = \"198.19.255.1:7474\"\nswitch = {id}\nrefresh_ms = 100"
                ),
            );
        }
        assert!(
            !t.contains("[switch.replication]"),
            "both switches edited: {t}"
        );
        t
    });
    let dump = lab.file.with_extension("sync.csv");
    let collector = collector_in(&lab, "c1", "198.19.255.1:7474", &dump);
    let out = lab.exec(
        "h1",
        &["ping", "-c", "3", "-i", "0.2", "-W", "2", "198.18.0.2"],
    );
    assert!(text(&out).contains("3 received"), "{}", text(&out));
    let (mut from, mut migrated) = (String::new(), String::new());
    let flags = ["-t", "6", "-i", "0.1", "--snd-timeout", "3000"];
    let out = iperf3_client(&lab, &flags, 1, 30, || {
        std::thread::sleep(Duration::from_millis(2000));
        let (s1, s2) = (lab.rx_packets("s1", "p0"), lab.rx_packets("s2", "p0"));
        assert!(s1.max(s2) > 1000, "the transfer is under way: {s1} {s2}");
        let (carrying, other) = if s1 >= s2 { ("1", "2") } else { ("2", "1") };
        from = format!("s{carrying}");
        let moved = ctl_sync(
            &lab,
            &[
                "migrate",
                "--from-switch",
                carrying,
                "--from-stream",
                "0",
                "--to-switch",
                other,
            ],
        );
        migrated = text(&moved);
        assert!(moved.status.success(), "{migrated}");
        assert!(kill("-KILL", &lab.switch_pid(&from).to_string()));
    });
    interrupt(collector);
    assert!(
        out.status.success(),
        "the transfer survived {from}'s death after the move ({migrated}):\n{}",
        text(&out)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report.get("error").is_none(), "{report}");
    let bytes: Vec<u64> = (report["intervals"].as_array().unwrap().iter())
        .map(|i| i["sum"]["bytes"].as_u64().unwrap())
        .collect();
    let last_second = &bytes[bytes.len().saturating_sub(10)..];
    assert!(
        last_second.iter().filter(|&&b| b > 0).count() >= 8,
        "the connection moves data at the end: {bytes:?}"
    );
    eprintln!(
        "nat moved by sync migrate: {} ms without data ({from} killed; {})",
        bytes.iter().filter(|&&b| b == 0).count() * 100,
        migrated.trim()
    );
}

/// `lab bench` on a lab of its own: each mode delivers packets and TCP, and the switch's
/// own CPU is a figure for stateplane and no figure for the bridge (the kernel's, which
/// no process of its own shows), in JSON and in the table.
#[test]
fn lab_bench_measures_each_mode_and_gives_the_bridge_no_switch_cpu() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let args = [
        "lab",
        "bench",
        "--seconds",
        "1",
        "--repeat",
        "1",
        "--modes",
        "bridge,routing,bridge-offloads,afpacket-offloads",
    ];
    let out = common::bin().args(args).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = report["results"].as_array().unwrap();
    let mode = |m: &str| results.iter().find(|r| r["mode"] == m).unwrap();
    for m in ["bridge", "routing", "bridge-offloads", "afpacket-offloads"] {
        // Each mode forwards the flood, TCP and every ping (a lost ping fails the run);
        // routing takes all of the flood's addresses to h2 as the others do.
        let r = mode(m);
        assert!(r["mpps"].as_f64().unwrap() > 0.01, "{m}: {report}");
        let (mpps, offered) = (
            r["mpps"].as_f64().unwrap(),
            r["offered_mpps"].as_f64().unwrap(),
        );
        if !m.starts_with("afpacket") {
            assert!(
                mpps > offered * 0.9,
                "{m} delivers what h1 offers: {report}"
            );
        }
        assert!(r["tcp_gbps"].as_f64().unwrap() > 0.1, "{m}: {report}");
        assert!(r["tcp_retransmits"].as_f64().is_some(), "{m}: {report}");
        let ping = r["ping_median_us"].as_f64().unwrap();
        assert!(
            ping > 0.0 && ping <= r["ping_p99_us"].as_f64().unwrap(),
            "{m}: {report}"
        );
    }
    for m in ["bridge", "routing", "bridge-offloads"] {
        assert!(mode(m)["switch_cpu_s_per_mpkt"].is_null(), "{report}");
    }
    // Offloads carry TCP in 64 KiB segments: the bridge moves more with them on.
    assert!(
        mode("bridge-offloads")["tcp_gbps"].as_f64() > mode("bridge")["tcp_gbps"].as_f64(),
        "{report}"
    );
    assert!(
        mode("afpacket-offloads")["switch_cpu_s_per_mpkt"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{report}"
    );
    let table = common::bin().args(args).output().unwrap();
    assert!(text(&table).contains("n/a (kernel)"), "{}", text(&table));
    let twice = common::bin()
        .args(["lab", "bench", "--modes", "afxdp,afxdp"])
        .output()
        .unwrap();
    assert!(
        !twice.status.success() && text(&twice).contains("'afxdp' is named twice"),
        "{}",
        text(&twice)
    );
}

/// `lab bench-failover` measures each setting on a lab of its own and removes it: the
/// stateless and the replicated switches' streams arrive whole after the kill, the
/// unreplicated firewall's and NAT's cannot; bad flags are refused by name. `lab bench-latency`
/// times every echo through each setting.
#[test]
fn bench_failover_checks_every_byte_and_tells_the_settings_apart() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require("redis-server");
    let dir = common::tmp_dir("failover");
    let csv = dir.join("failover.csv");
    let out = bin()
        .args(["lab", "bench-failover", "--leases", "200", "--repeat", "1"])
        .args(["--seconds", "2", "--csv"])
        .arg(&csv)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("every byte arrived"), "{table}");
    let rows = std::fs::read_to_string(&csv).unwrap();
    let delivered = |setting: &str| -> bool {
        let row = (rows.lines())
            .find(|r| r.starts_with(&format!("{setting},")))
            .unwrap_or_else(|| panic!("no {setting} in {rows}"));
        row.ends_with(",true")
    };
    assert!(delivered("forward"), "{rows}");
    for program in ["firewall", "nat"] {
        assert!(delivered(&format!("{program}-replicated")), "{rows}");
        assert!(!delivered(&format!("{program}-unreplicated")), "{rows}");
    }
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !text(&ns).contains("sp-failover-"),
        "the bench's lab is gone"
    );
    let refused = bin()
        .args(["lab", "bench-failover", "--leases", "50"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(text(&refused).contains("--leases: 50 is outside 100 to 60000"));

    // `lab bench-latency`: every echo answered and timed, for each setting.
    let out = bin()
        .args([
            "lab",
            "bench-latency",
            "--pings",
            "20",
            "--repeat",
            "1",
            "--csv",
        ])
        .arg(&csv)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let rows = std::fs::read_to_string(&csv).unwrap();
    for setting in [
        "forward",
        "firewall-unreplicated",
        "firewall-replicated",
        "nat-unreplicated",
        "nat-replicated",
        "counter-unreplicated",
        "counter-replicated",
    ] {
        let echoes = (rows.lines())
            .filter(|r| r.starts_with(&format!("{setting},")))
            .count();
        assert_eq!(echoes, 20, "{setting}: {rows}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lab_down_cleans_up_after_a_crash_and_up_refuses_a_lab_twice() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up("line.toml", "tcrash");
    assert_eq!(lab.namespaces().len(), 4);
    let again = lab.cmd(&["up"]);
    assert!(!again.status.success());
    assert!(text(&again).contains("already up"), "{}", text(&again));
    // A crash: the switch dies and the lab's state directory is lost.
    let pid = lab.switch_pid("s1").to_string();
    kill("-KILL", &pid);
    let dir = std::env::var_os("STATEPLANE_LAB_DIR")
        .map_or_else(|| PathBuf::from("/run/stateplane/lab"), PathBuf::from);
    std::fs::remove_dir_all(dir.join(&lab.name)).unwrap();
    let out = lab.cmd(&["down"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(lab.namespaces().is_empty(), "nothing is left behind");
    let links = Command::new("ip").args(["-br", "link"]).output().unwrap();
    assert!(
        !text(&links).contains("m-s1"),
        "no interface is left in the host namespace"
    );
}

#[test]
fn a_topology_with_an_outside_address_is_refused_before_anything_is_made() {
    let dir = common::tmp_dir("lab");
    let file = dir.join("bad.toml");
    let text_in = std::fs::read_to_string(topologies().join("line.toml"))
        .unwrap()
        .replace("name = \"line\"", "name = \"tbad\"")
        .replace("198.18.0.2/24", "192.168.1.2/24");
    std::fs::write(&file, &text_in).unwrap();
    let out = bin().args(["lab", "up"]).arg(&file).output().unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("outside 198.18.0.0/15"),
        "{}",
        text(&out)
    );
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(!text(&ns).contains("sp-tbad-"));
    // Without root, the user is told so before anything is tried.
    let good = dir.join("good.toml");
    std::fs::write(&good, text_in.replace("192.168.1.2/24", "198.18.0.2/24")).unwrap();
    require("setpriv");
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_stateplane"))
        .args(["lab", "up"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("run stateplane lab as root"),
        "{}",
        text(&out)
    );
}

#[test]
fn live_run_errors_name_the_interface_and_the_fix() {
    let out = bin()
        .args(["run", "forward", "-I", "nosuch0", "-I", "lo"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let t = text(&out);
    assert!(t.contains("there is no interface 'nosuch0'"), "{t}");
    assert!(
        !t.contains("AF_XDP not possible"),
        "a missing interface is not a fallback: {t}"
    );
    // Without the privilege: an unprivileged user is told which capabilities and how.
    require("setpriv");
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_stateplane"))
        .args(["run", "--io", "afpacket", "-I", "lo"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("not permitted") && t.contains("CAP_NET_RAW") && t.contains("setcap"),
        "{t}"
    );
    let out = bin()
        .args(["run", "-I", "lo", "-i", "x.pcap"])
        .output()
        .unwrap();
    assert!(text(&out).contains("cannot be mixed"), "{}", text(&out));
}

/// The Prometheus text a switch serves on its namespace's loopback.
/// `hh` with its sketches in bounded mode on live AF_PACKET ports: pings go through
/// without loss while snapshots go to the store every 10 ms on the live clock (the idle
/// ticks read them), fresh all along, a reload (SIGHUP) in the middle included (the new
/// instance goes on from the old one's state and the snapshots go on).
#[test]
fn hh_in_bounded_mode_snapshots_on_live_ports_while_traffic_flows() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up_edited("line.toml", "tbounded", Some("afpacket"), |t| {
        t.replace(
            "[switch.program]\nname = \"forward\"",
            "[switch.program]\nname = \"hh\"\n[switch.program.hh]\n\
             map = { p0 = \"p1\", p1 = \"p0\" }\n[switch.guarantees]\n\
             sketch = [\"replicated\"]\n[switch.replication]\nmode = \"bounded\"\n\
             snapshot_ms = 10\nstaleness_ms = 500",
        )
    });
    let ping = ping_in_background(&lab, "200", "0.01");
    std::thread::sleep(Duration::from_millis(600));
    let log = lab_file(&lab, "s1.log");
    assert!(kill("-HUP", &lab.switch_pid("s1").to_string()));
    let reloaded = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        (std::fs::read_to_string(&log).unwrap()).contains("reloaded the program (generation 1)")
    });
    assert!(reloaded, "{}", std::fs::read_to_string(&log).unwrap());
    let ping = ping.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&ping.stdout).contains(" 0% packet loss"),
        "{}",
        text(&ping)
    );
    let metrics = metric_lines(&lab, "s1");
    let value = |name: &str| -> f64 {
        (metrics.lines())
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
            .parse()
            .unwrap()
    };
    // Two seconds of pings: some tens of snapshots, none stale, the reload's included
    // (a snapshot the reload cut short would leave the store's state ever staler), and
    // the old state fitted the new instance.
    assert!(
        value("stateplane_replication_snapshots_total") >= 40.0,
        "{metrics}"
    );
    assert_eq!(value("stateplane_replication_stale_packets_total"), 0.0);
    assert!(value("stateplane_replication_staleness_most_seconds") < 0.5);
    assert_eq!(value("stateplane_replication_states_refused_total"), 0.0);
}

/// `count` pings from h1 to h2 every `interval` seconds, running while the test goes on
/// (its output kept for `wait_with_output`).
fn ping_in_background(lab: &Lab, count: &str, interval: &str) -> std::process::Child {
    let ns = format!("sp-{}-h1", lab.name);
    Command::new("ip")
        .args([
            "netns", "exec", &ns, "ping", "-c", count, "-i", interval, "-W", "2",
        ])
        .arg("198.18.0.2")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Packets worker `w` received, as the switch's `metrics` text counts them.
fn worker_rx(metrics: &str, w: &str) -> u64 {
    let prefix = format!("stateplane_rx_packets_total{{worker=\"{w}\"}} ");
    (metrics.lines())
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse::<u64>().unwrap())
}

fn metric_lines(lab: &Lab, node: &str) -> String {
    let fetch = "import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:9464/metrics', timeout=5).read().decode())";
    let out = lab.exec(node, &["python3", "-c", fetch]);
    assert!(out.status.success(), "metrics: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of the metric `name` (with its labels) in `metrics` (0 before the first).
fn metric(metrics: &str, name: &str) -> u64 {
    let prefix = format!("{name} ");
    (metrics.lines())
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse::<u64>().unwrap())
}

/// The packets `node` has dropped for `reason`, from its metrics (0 before the first).
fn drops(lab: &Lab, node: &str, reason: &str) -> u64 {
    let name = format!("stateplane_drops_total{{reason=\"{reason}\"}}");
    metric(&metric_lines(lab, node), &name)
}

/// Checks that each of `streams` iperf3 connections moved data in the report's last
/// interval, `after` what (for the message).
fn every_stream_moved_at_the_end(report: &serde_json::Value, streams: usize, after: &str) {
    let intervals = report["intervals"].as_array().unwrap();
    let last = intervals.last().unwrap()["streams"].as_array().unwrap();
    assert_eq!(last.len(), streams);
    for (i, stream) in last.iter().enumerate() {
        let bytes = stream["bytes"].as_u64().unwrap();
        assert!(bytes > 0, "connection {i} stalled after {after}: {report}");
    }
}

fn lab_file(lab: &Lab, file: &str) -> PathBuf {
    std::env::var_os("STATEPLANE_LAB_DIR")
        .map_or_else(|| PathBuf::from("/run/stateplane/lab"), PathBuf::from)
        .join(&lab.name)
        .join(file)
}

/// SIGHUP reloads the program while traffic flows, losing nothing; a broken configuration
/// is refused and the running program stays; SIGTERM drains and prints the summary.
#[test]
fn reload_loses_no_packets_and_sigterm_drains_and_reports() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up("line.toml", "treload");
    let pid = lab.switch_pid("s1").to_string();
    let config = lab_file(&lab, "s1.toml");
    let good = std::fs::read_to_string(&config).unwrap();
    let ping = ping_in_background(&lab, "400", "0.005");
    let log = lab_file(&lab, "s1.log");
    let mut generation = 0;
    for round in 0..6 {
        std::thread::sleep(Duration::from_millis(100));
        let expect = if round == 3 {
            std::fs::write(&config, good.replace("forward", "no_such_program")).unwrap();
            "reload refused".to_owned()
        } else {
            std::fs::write(&config, &good).unwrap();
            generation += 1;
            format!("reloaded the program (generation {generation})")
        };
        let seen_before = std::fs::read_to_string(&log)
            .unwrap()
            .matches(&expect)
            .count();
        assert!(kill("-HUP", &pid));
        // One reload at a time: wait (bounded) until the switch has logged this one.
        for _ in 0..100 {
            let now = std::fs::read_to_string(&log)
                .unwrap()
                .matches(&expect)
                .count();
            if now > seen_before {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let out = ping.wait_with_output().unwrap();
    assert!(
        text(&out).contains("400 received"),
        "no echo lost across reloads:\n{}",
        text(&out)
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(kill("-TERM", &pid));
    let mut text_log = String::new();
    for _ in 0..100 {
        text_log = std::fs::read_to_string(&log).unwrap();
        if text_log.contains("packets in") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        text_log.contains("reloaded the program (generation 5)"),
        "{text_log}"
    );
    assert!(
        text_log.contains("reload refused, the running program stays")
            && text_log.contains("no_such_program"),
        "{text_log}"
    );
    assert!(text_log.contains("stopped; queues drained"), "{text_log}");
    let line = |key: &str| -> u64 {
        let l = text_log
            .lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap();
        l.split_whitespace().last().unwrap().parse().unwrap()
    };
    assert!(
        line("packets in") >= 800,
        "both directions of 400 echoes were counted"
    );
    assert_eq!(
        line("packets in"),
        line("packets out"),
        "forward dropped nothing"
    );
}

/// `counter` with its flows replicated to a redis-server on the controller, on live ports
/// (AF_PACKET): each output waits for its flow's write to be acknowledged (held across
/// bursts, the worker going on meanwhile), yet TCP through it delivers every byte and every
/// ping is answered; SIGTERM hands back what is held, and the report shows no packet
/// dropped, outputs held, and the flows in the store.
#[test]
fn replicated_counter_on_live_ports_holds_outputs_for_redis_and_delivers_tcp_whole() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require("redis-server");
    let lab = Lab::up_edited("line.toml", "trepl", Some("afpacket"), |t| {
        t.replace(
            "[switch.program]\nname = \"forward\"",
            "[switch.program]\nname = \"counter\"\n[switch.program.counter]\n\
             map = { p0 = \"p1\", p1 = \"p0\" }\n[switch.guarantees]\nflows = [\"replicated\"]\n\
             [switch.replication]\nstore = \"redis://198.19.255.1:6390/\"\nlease_ms = 200",
        )
        .replace(
            "[controller]\nname = \"c1\"",
            "[controller]\nname = \"c1\"\nredis = 6390",
        )
    });
    let (sent, received) = exact_transfer(&lab, 5 << 20, 5303);
    assert!(sent.starts_with(&format!("{} ", 5 << 20)), "client: {sent}");
    assert_eq!(sent, received, "every byte arrives, in order, unchanged");
    let ping = lab.exec(
        "h1",
        &["ping", "-c", "50", "-i", "0.01", "-W", "2", "198.18.0.2"],
    );
    assert!(
        text(&ping).contains("50 received"),
        "{}\nthe switch's log:\n{}",
        text(&ping),
        std::fs::read_to_string(lab_file(&lab, "s1.log")).unwrap_or_default()
    );
    let records = lab.exec(
        "c1",
        &["redis-cli", "-h", "198.19.255.1", "-p", "6390", "dbsize"],
    );
    let records: u64 = String::from_utf8_lossy(&records.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(
        records >= 3,
        "the TCP connection's, ping's and ARP's flows: {records}"
    );
    // The stage's counts are on the metrics endpoint while it runs.
    let metrics = metric_lines(&lab, "s1");
    let writes: u64 = (metrics.lines())
        .find_map(|l| l.strip_prefix("stateplane_replication_writes_total "))
        .unwrap_or_else(|| panic!("{metrics}"))
        .parse()
        .unwrap();
    assert!(writes > 0, "{metrics}");
    assert!(
        (metrics.lines()).any(|l| l.starts_with("stateplane_replication_held ")),
        "{metrics}"
    );
    // And the bound it is held within.
    assert!(
        (metrics.lines()).any(|l| l == "stateplane_replication_held_limit 65536"),
        "{metrics}"
    );
    let pid = lab.switch_pid("s1").to_string();
    assert!(kill("-TERM", &pid));
    let log = lab_file(&lab, "s1.log");
    let mut text_log = String::new();
    for _ in 0..100 {
        text_log = std::fs::read_to_string(&log).unwrap();
        if text_log.contains("packets held at most") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The figures of the report's replication block, each after its words.
    let block = text_log
        .split_once("replication to redis://198.19.255.1:6390/:")
        .map_or("", |(_, b)| b);
    let after = |key: &str| -> u64 {
        let at = block
            .find(key)
            .unwrap_or_else(|| panic!("{key}: {text_log}"));
        block[at + key.len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(!block.is_empty(), "{text_log}");
    assert_eq!(after("dropped unreplicated"), 0, "{text_log}");
    assert!(after("packets ") > 3_000, "{text_log}");
    assert!(
        after("for the store") > 0,
        "outputs waited for their writes: {text_log}"
    );
    assert!(after("packets held at most") > 0, "{text_log}");
}

/// Two workers on single-queue veths: `io = "auto"` falls back to AF_PACKET (saying why),
/// the fanout group spreads connections over both workers, and TCP still arrives whole.
#[test]
fn two_workers_share_each_port_through_the_fanout_group() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up_edited("line.toml", "tfan", None, |t| {
        t.replace("workers = 1", "workers = 2")
    });
    let started = std::fs::read_to_string(lab_file(&lab, "s1.log")).unwrap();
    assert!(
        started.contains("AF_XDP not possible") && started.contains("queue per worker"),
        "{started}"
    );
    assert!(started.contains("p0: AF_PACKET, 2 queue(s)"), "{started}");
    std::thread::sleep(Duration::from_millis(300));
    let out = lab.exec(
        "h1",
        &["ping", "-c", "3", "-i", "0.2", "-W", "2", "198.18.0.2"],
    );
    assert!(text(&out).contains("3 received"), "{}", text(&out));
    iperf3(&lab, &["-n", "64M"], 16, || {});
    let (sent, received) = exact_transfer(&lab, 8 << 20, 5303);
    assert_eq!(sent, received, "every byte arrives with two workers");
    let metrics = metric_lines(&lab, "s1");
    for w in ["0", "1"] {
        let n = worker_rx(&metrics, w);
        assert!(n > 1000, "worker {w} got connections: {n}\n{metrics}");
    }
}

/// `conntrack` on live ports with real TCP: iperf3's connections get through, and a clean
/// connection (opened, carried, closed by FIN) loses no packet to the tracker.
#[test]
fn tcp_through_conntrack_is_tracked_and_delivered() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up_edited("line.toml", "tct", None, |t| {
        t.replace("name = \"forward\"", "name = \"conntrack\"")
    });
    let out = lab.exec(
        "h1",
        &["ping", "-c", "2", "-i", "0.2", "-W", "2", "198.18.0.2"],
    );
    assert!(text(&out).contains("2 received"), "{}", text(&out));
    // iperf3's server ends its streams with resets; packets still in flight after a reset
    // are dropped as invalid, as a stateful firewall does.
    iperf3(&lab, &["-n", "50M"], 4, || {});
    let invalid = || {
        std::thread::sleep(Duration::from_millis(300));
        drops(&lab, "s1", "invalid")
    };
    let before = invalid();
    let (sent, received) = exact_transfer(&lab, 8 << 20, 5304);
    assert_eq!(sent, received, "every byte through conntrack");
    assert_eq!(
        invalid(),
        before,
        "a clean connection loses nothing to the tracker"
    );
}

/// Path MTU discovery through `nat` (topologies/nat-pmtu.toml): the router behind the NAT
/// refuses h1's full-size segments with "fragmentation needed" sent to the external
/// address; the NAT translates each error back to h1, which learns the path's MTU of
/// 1280, and an exact transfer and iperf3 complete. Without the translation h1 never
/// learns it (Linux probes no MTU by default) and the transfer stalls.
#[test]
fn path_mtu_discovery_works_through_nat() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up("nat-pmtu.toml", "tpmtu");
    lab.server = "198.18.1.2";
    let (sent, received) = exact_transfer(&lab, 4 << 20, 5307);
    assert_eq!(sent, received, "every byte, in segments that fit the path");
    let route = lab.exec("h1", &["ip", "route", "get", "198.18.1.2"]);
    assert!(
        text(&route).contains("mtu 1280"),
        "h1 learnt the path's MTU from the translated error:\n{}{}{}",
        text(&route),
        text(&lab.exec("r1", &["ip", "link", "show", "eth1"])),
        text(&lab.exec("r1", &["sysctl", "net.ipv4.ip_forward"])),
    );
    let report = iperf3(&lab, &["-n", "20M"], 2, || {});
    let sent = report["end"]["sum_sent"]["bytes"].as_u64().unwrap();
    assert!(sent >= mib(20), "iperf3 sent {sent}");
}

/// `nat` on two workers over live ports, which its fanout groups spread by the remote
/// address: h1 sends an exact transfer to each of eight addresses of h2, across r1's
/// 1280-byte link, so each needs path MTU discovery, whose errors come from r1 and reach
/// the worker of the connection they quote. Every byte arrives, no answer is unknown, and
/// both workers carried traffic.
#[test]
fn nat_on_two_workers_spreads_remote_hosts_and_their_errors_over_them() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The default io: AF_XDP would spread by the NIC's hash, so the switch takes AF_PACKET.
    let mut lab = Lab::up_edited("nat-pmtu.toml", "tnat2w", None, |t| {
        t.replace("workers = 1", "workers = 2")
    });
    let remotes = [
        "198.18.1.2",
        "198.18.1.3",
        "198.18.1.4",
        "198.18.1.5",
        "198.18.1.6",
        "198.18.1.7",
        "198.18.1.8",
        "198.18.1.9",
    ];
    for remote in &remotes[1..] {
        let out = lab.exec(
            "h2",
            &["ip", "addr", "add", &format!("{remote}/24"), "dev", "eth0"],
        );
        assert!(out.status.success(), "{}", text(&out));
    }
    for (i, remote) in remotes.into_iter().enumerate() {
        lab.server = remote;
        let (sent, received) = exact_transfer(&lab, 1 << 20, 5310 + i as u16);
        assert_eq!(sent, received, "every byte to {remote}");
        let route = text(&lab.exec("h1", &["ip", "route", "get", remote]));
        assert!(
            route.contains("mtu 1280"),
            "h1 learnt {remote}'s path MTU:\n{route}"
        );
    }
    assert_eq!(drops(&lab, "s1", "no_translation"), 0);
    let metrics = metric_lines(&lab, "s1");
    let received = |w: &str| worker_rx(&metrics, w);
    assert!(
        received("0") > 500 && received("1") > 500,
        "both workers carried transfers:\n{metrics}"
    );
}

/// IPv6 through `nat` on live ports, under its default `ipv6 = "stateful"`: h1 (inside)
/// pings h2 by its link-local address, neighbor discovery crossing both ways; h2's pings
/// to h1 are dropped and counted as unsolicited.
/// `sgw` on two live workers: the generated mobile workload (signaling, uplink and
/// downlink, a third of it IPv6) sent from h1 reaches, packet by packet, the worker whose
/// share the subscriber's place is (the fanout steers by subscriber): every request is
/// accepted, no packet finds no session, both workers carry traffic, and every uplink
/// packet comes out to h2 decapsulated.
#[test]
fn sgw_on_two_workers_serves_each_subscriber_on_the_worker_of_its_place() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up_edited("line.toml", "tsgw2w", None, |t| {
        t.replace("workers = 1", "workers = 2").replace(
            "name = \"forward\"",
            "name = \"sgw\"\n[switch.program.sgw]\naddress = \"198.19.255.2\"\n\
             ue_pool = \"198.18.128.0/17\"\nue_pool6 = \"2001:2:0:8000::/49\"\n\
             access = \"p0\"\ncore = \"p1\"",
        )
    });
    let trace = lab.file.with_extension("gtp.pcap");
    let mut generate = common::bin();
    generate.args([
        "gen",
        "gtp",
        "--packets",
        "6000",
        "--ipv6-share",
        "0.3",
        "--seed",
        "7",
    ]);
    let out = generate.arg("-o").arg(&trace).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // What the trace asks of the gateway.
    let (mut requests, mut uplink) = (0u64, 0u64);
    let hasher = stateplane_wire::FlowHasher::with_seed(1);
    for (_, frame, _) in stateplane_io::capture::read_all(&trace).unwrap() {
        let p = stateplane_wire::parse(&frame, 0, &hasher).unwrap();
        let to_gateway = p.key.dst[..4] == [198, 19, 255, 2];
        if to_gateway && p.flags.has(stateplane_wire::ParseFlags::GTPC) {
            requests += 1;
        } else if to_gateway && p.flags.has(stateplane_wire::ParseFlags::GTPU) {
            uplink += 1;
        }
    }
    assert!(requests > 200 && uplink > 2000, "{requests} {uplink}");
    let before = lab.rx_packets("h2", "eth0");
    let trace_arg = trace.to_string_lossy();
    let sent = lab.exec(
        "h1",
        &[
            env!("CARGO_BIN_EXE_stateplane"),
            "send",
            "-I",
            "eth0",
            &trace_arg,
        ],
    );
    assert!(sent.status.success(), "{}", text(&sent));
    std::thread::sleep(Duration::from_millis(500));
    let metrics = metric_lines(&lab, "s1");
    for reason in [
        "no_session",
        "wrong_enb",
        "spoofed",
        "no_bearer",
        "bad_signaling",
    ] {
        assert_eq!(drops(&lab, "s1", reason), 0, "{reason}:\n{metrics}");
    }
    for port in ["p0", "p1"] {
        let drops = port_count(&metrics, "rx_kernel_drops", port);
        assert_eq!(drops, Some(0), "{port}:\n{metrics}");
    }
    let received = |w: &str| worker_rx(&metrics, w);
    assert!(
        received("0") > 1000 && received("1") > 1000,
        "both workers carry subscribers:\n{metrics}"
    );
    let stats = text(&ctl(&lab, &["stats", "sessions"]));
    assert!(
        stats.contains(&format!("sessions.requests_accepted {requests}\n")),
        "every one of {requests} requests accepted:\n{stats}"
    );
    let delivered = lab.rx_packets("h2", "eth0") - before;
    assert!(
        delivered >= uplink,
        "{delivered} of {uplink} uplink packets out to the core"
    );
}

#[test]
fn ipv6_crosses_nat_only_as_the_inside_opens_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up("line-nat.toml", "tnat6");
    // Link-local addresses from the hosts' MACs (EUI-64), once duplicate address
    // detection has let them go (at most 5 s).
    for host in ["h1", "h2"] {
        let settled = (0..50).any(|_| {
            let out = lab.exec(
                host,
                &["ip", "-6", "addr", "show", "dev", "eth0", "tentative"],
            );
            std::thread::sleep(Duration::from_millis(100));
            out.status.success() && out.stdout.is_empty()
        });
        assert!(settled, "{host}'s link-local address is still tentative");
    }
    let ping = |from: &str, to: &str| {
        let out = lab.exec(from, &["ping", "-6", "-c", "3", "-i", "0.2", "-W", "2", to]);
        text(&out)
    };
    let out = ping("h1", "fe80::ff:fe00:102%eth0");
    assert!(
        out.contains(" 3 received"),
        "h1 reaches h2 over IPv6:\n{out}"
    );
    let out = ping("h2", "fe80::ff:fe00:101%eth0");
    assert!(out.contains(" 0 received"), "h2 does not reach h1:\n{out}");
    std::thread::sleep(Duration::from_millis(300));
    let unsolicited = drops(&lab, "s1", "unsolicited");
    assert!(
        unsolicited >= 3,
        "h2's echo requests counted: {unsolicited}"
    );
}

/// SIGHUP with a changed `nat` configuration (a new pool, a new timeout) keeps the
/// translations, as Linux keeps its connections' NAT bindings across `iptables-restore`:
/// four iperf3 connections through the NAT go on across two reloads, no answer is dropped
/// as unknown, each connection moves data in the last second, and the switch says what
/// it kept. A reload that forgot them drops answers as `no_translation` (hundreds here)
/// until each connection's next packet from the inside makes a new translation, on
/// another port where the pool changed.
#[test]
fn a_reload_keeps_nat_translations_and_connections_go_on() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up("line-nat.toml", "tnatrl");
    let pid = lab.switch_pid("s1").to_string();
    let config = lab_file(&lab, "s1.toml");
    let log = lab_file(&lab, "s1.log");
    let first = std::fs::read_to_string(&config).unwrap();
    let external = "external = \"198.18.0.100\"";
    assert!(first.contains(external), "{first}");
    let changed = first.replace(
        external,
        &format!("{external}\nports = \"20000-30000\"\ntimeouts = {{ udp = 45 }}"),
    );
    let reload = |text: &str, generation: u32| {
        std::fs::write(&config, text).unwrap();
        assert!(kill("-HUP", &pid));
        let done = format!("reloaded the program (generation {generation})");
        let logged = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            std::fs::read_to_string(&log).unwrap().contains(&done)
        });
        assert!(logged, "{}", std::fs::read_to_string(&log).unwrap());
    };
    let no_translation = || drops(&lab, "s1", "no_translation");
    // Answers dropped as unknown from before the first reload to a second after the
    // last, while every connection is open (each closing connection's last answers may
    // come after its translation has gone, as they do without reloads).
    let mut unknown = (0, 0);
    let mut said = String::new();
    // The connections run 10 s: the count's window (three seconds of sleeps, two reloads
    // and two reads of the metrics: 5 s and more on a loaded host, which with 5 s
    // connections counted their closing) ends well before they close.
    let started = std::time::Instant::now();
    let mut window_end = Duration::ZERO;
    let report = iperf3(&lab, &["-t", "10"], 4, || {
        std::thread::sleep(Duration::from_millis(1000));
        unknown.0 = no_translation();
        reload(&changed, 1);
        std::thread::sleep(Duration::from_millis(1000));
        // The second through the control API, which says what each worker kept.
        std::fs::write(&config, &first).unwrap();
        let out = ctl(&lab, &["reload"]);
        assert!(out.status.success(), "{}", text(&out));
        said = text(&out);
        std::thread::sleep(Duration::from_millis(1000));
        unknown.1 = no_translation();
        window_end = started.elapsed();
    });
    assert!(
        window_end < Duration::from_secs(9),
        "the answers were counted until {window_end:?} after the 10 s connections began: \
         too late to tell reloads from connections closing"
    );
    assert_eq!(
        unknown.0, unknown.1,
        "no answer went unknown across the reloads"
    );
    every_stream_moved_at_the_end(&report, 4, "the reloads");
    let text_log = std::fs::read_to_string(&log).unwrap();
    let kept: Vec<u64> = (text_log.lines())
        .filter_map(|l| l.split("reload: translations: kept ").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    // The four data connections and iperf3's control connection, both times.
    assert!(
        kept.len() == 2 && kept.iter().all(|&n| n >= 5),
        "what each reload kept: {kept:?}\n{text_log}"
    );
    assert!(
        said.starts_with("reloaded the program (generation 2)\n"),
        "{said}"
    );
    assert!(
        !said.contains("had not taken"),
        "the one worker took it: {said}"
    );
    assert!(
        said.contains(&format!("worker 0: translations: kept {} entries", kept[1])),
        "{said}"
    );
    // A broken configuration is refused by name, and the running program stays.
    std::fs::write(
        &config,
        first.replace(external, &format!("{external}\nports = \"x\"")),
    )
    .unwrap();
    let out = ctl(&lab, &["reload"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("reload refused, the running program stays")
            && text(&out).contains("program.nat.ports"),
        "{}",
        text(&out)
    );
    let table = text(&ctl(&lab, &["read", "translations"]));
    assert!(table.contains("external_port="), "{table}");
}

/// `nat` on live ports: ping, iperf3 and an exact transfer from h1 reach h2 as the
/// external address, every byte arrives, and the translations are there to read.
#[test]
fn tcp_udp_and_ping_through_nat_arrive_from_the_external_address() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up("line-nat.toml", "tnat");
    let out = lab.exec(
        "h1",
        &["ping", "-c", "3", "-i", "0.2", "-W", "2", "198.18.0.2"],
    );
    assert!(text(&out).contains("3 received"), "{}", text(&out));
    let report = iperf3(&lab, &["-n", "50M"], 4, || {});
    let sent = report["end"]["sum_sent"]["bytes"].as_u64().unwrap();
    assert!(sent >= mib(50), "iperf3 sent {sent}");
    // UDP: 100 datagrams echoed by h2, which names the address they came from.
    let server = "import socket\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.bind(('198.18.0.2',5306))\n\
         s.settimeout(20); peers=set()\n\
         for _ in range(100):\n    b,a=s.recvfrom(2048); peers.add(a[0]); s.sendto(b,a)\n\
         print(' '.join(sorted(peers)))";
    let client = "import socket\n\
         c=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); c.settimeout(2); n=0\n\
         for i in range(100):\n    c.sendto(b'x%d'%i,('198.18.0.2',5306))\n    \
         try:\n        n+=c.recvfrom(2048)[0]==b'x%d'%i\n    except OSError: pass\n\
         print(n)";
    let ns = format!("sp-{}-h2", lab.name);
    let srv = Command::new("ip")
        .args([
            "netns", "exec", &ns, "timeout", "30", "python3", "-c", server,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let echoed = lab.exec("h1", &["timeout", "30", "python3", "-c", client]);
    let peers = srv.wait_with_output().unwrap();
    assert_eq!(text(&echoed).trim(), "100", "every datagram echoed");
    assert_eq!(
        String::from_utf8_lossy(&peers.stdout).trim(),
        "198.18.0.100",
        "UDP arrives from the external address"
    );
    let (sent, received, peer) = exact_transfer_from(&lab, 8 << 20, 5305);
    assert_eq!(sent, received, "every byte through nat");
    assert_eq!(peer, "198.18.0.100", "h2 sees the external address");
    let table = ctl(&lab, &["read", "translations"]);
    let table = text(&table);
    let entry = |needle: &str| table.lines().find(|l| l.contains(needle)).unwrap_or("");
    assert!(
        entry("dst_port=5305").contains("tcp_closing"),
        "the transfer's connection, closed by FIN, is closing:\n{table}"
    );
    assert!(
        entry("dst_port=5306").contains("udp external_port=")
            && entry("dst_port=5306").contains("packets_out=100 packets_in=100"),
        "every datagram counted both ways:\n{table}"
    );
    assert!(entry("proto=1 ").contains("icmp"), "{table}");
}

/// `nat` with endpoint-independent mapping and filtering on live ports, as UDP hole
/// punching (STUN, RFC 5128) needs it: h1's socket reaches two of h2's ports from one
/// external port, and a datagram from a third port of h2, which h1 never sent to, reaches
/// h1. Reloaded to the default filtering (the mapping kept), the same punch to a fresh
/// socket is dropped as `no_translation`.
#[test]
fn udp_hole_punching_works_through_nat_with_endpoint_independent_filtering() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let external = "external = \"198.18.0.100\"";
    let independent = "mapping = \"endpoint_independent\"\nfiltering = \"endpoint_independent\"";
    let lab = Lab::up_edited("line-nat.toml", "tnateif", None, |t| {
        t.replace(external, &format!("{external}\n{independent}"))
    });
    // h2 learns h1's mapped endpoint from two of its ports, then punches from a third.
    let server = "import socket\n\
         def bound(p):\n    s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n    \
         s.bind(('198.18.0.2',p)); s.settimeout(10); return s\n\
         a,b,c=bound(3478),bound(3480),bound(3479)\n\
         _,pa=a.recvfrom(64); _,pb=b.recvfrom(64)\n\
         c.sendto(b'punch',pa)\n\
         print(pa[1],pb[1])";
    let client = |port: u16| {
        format!(
            "import socket\n\
             s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.bind(('198.18.0.1',{port}))\n\
             s.settimeout(3)\n\
             for p in (3478,3480): s.sendto(b'hello',('198.18.0.2',p))\n\
             try:\n    d,f=s.recvfrom(64); print(d.decode(),f[1])\n\
             except OSError: print('nothing')"
        )
    };
    let punch = |port: u16| {
        let ns = format!("sp-{}-h2", lab.name);
        let srv = Command::new("ip")
            .args([
                "netns", "exec", &ns, "timeout", "20", "python3", "-c", server,
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let got = lab.exec("h1", &["timeout", "20", "python3", "-c", &client(port)]);
        let seen = srv.wait_with_output().unwrap();
        (
            text(&got).trim().to_owned(),
            String::from_utf8_lossy(&seen.stdout).trim().to_owned(),
        )
    };
    let (got, seen) = punch(5000);
    assert_eq!(got, "punch 3479", "h2's third port reaches h1");
    let ports: Vec<&str> = seen.split_whitespace().collect();
    assert!(
        ports.len() == 2 && ports[0] == ports[1],
        "one external port for both destinations: {seen}"
    );
    // The default filtering lets only answers in.
    let config = lab_file(&lab, "s1.toml");
    let first = std::fs::read_to_string(&config).unwrap();
    let filtering = "filtering = \"endpoint_independent\"\n";
    assert!(first.contains(filtering), "{first}");
    std::fs::write(&config, first.replace(filtering, "")).unwrap();
    let out = ctl(&lab, &["reload"]);
    assert!(out.status.success(), "{}", text(&out));
    let before = drops(&lab, "s1", "no_translation");
    let (got, seen) = punch(5001);
    assert_eq!(got, "nothing", "h2 reached h1 unasked (h2 saw {seen})");
    assert!(drops(&lab, "s1", "no_translation") > before);
}

/// Hairpinning on live ports: h1 reaches its own forwarded port through the external
/// address (as an inside host reaches an inside server by its public address), its
/// connection arriving from the external address, and every byte comes back whole.
#[test]
fn an_inside_host_reaches_a_forwarded_port_through_the_external_address() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let external = "external = \"198.18.0.100\"";
    let lab = Lab::up_edited("line-nat.toml", "tnathp", None, |t| {
        t.replace(
            external,
            &format!("{external}\nports = \"20000-65535\"\nforwards = [{{ proto = \"tcp\", port = 8080, to = \"198.18.0.1\", to_port = 5320 }}]"),
        )
        .replace(
            "name = \"h1\"\n",
            "name = \"h1\"\nneighbors = [{ addr = \"198.18.0.100\", mac = \"02:00:00:00:01:02\", iface = \"eth0\" }]\n",
        )
    });
    let both = "import socket,threading,hashlib,random\n\
         s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('198.18.0.1',5320)); s.listen(1); s.settimeout(20); got={}\n\
         def serve():\n    c,peer=s.accept(); c.settimeout(20); h=hashlib.sha256(); n=0\n    \
         while True:\n        b=c.recv(65536)\n        if not b: break\n        h.update(b); n+=len(b)\n    \
         got['r']=(n,h.hexdigest(),peer[0])\n\
         t=threading.Thread(target=serve); t.start()\n\
         data=random.Random(7).randbytes(1<<20)\n\
         c=socket.create_connection(('198.18.0.100',8080),timeout=20); c.sendall(data); c.close(); t.join()\n\
         n,h,peer=got['r']\n\
         print(n==len(data) and h==hashlib.sha256(data).hexdigest(), peer)";
    let out = lab.exec("h1", &["timeout", "40", "python3", "-c", both]);
    assert_eq!(
        text(&out).trim(),
        "True 198.18.0.100",
        "every byte, from the external address"
    );
    assert_eq!(drops(&lab, "s1", "hairpin_unknown"), 0);
}

/// `firewall` on live ports: h1 (inside) reaches h2 with ping and TCP, every byte
/// arrives; h2 cannot ping h1, and the refusals are counted as unsolicited. An inbound
/// rule (pf's `pass in`) lets h2 open a TCP connection to h1's port 5309, and to no
/// other port.
#[test]
fn a_firewall_lets_the_inside_out_and_only_answers_in() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up_edited("line.toml", "tfw", None, |t| {
        t.replace(
            "name = \"forward\"",
            "name = \"firewall\"\n[switch.program.firewall]\nrules = [{ action = \"permit\", \
             direction = \"in\", match = \"tcp,nw_dst=198.18.0.1,tp_dst=5309\" }]",
        )
    });
    // h2 connects to h1's two listeners: 5309 answers with what it read, 5310 is never
    // reached.
    let inbound = |port: u16| {
        let server = format!(
            "import socket\n\
             s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('198.18.0.1',{port})); s.listen(1); s.settimeout(8)\n\
             c,_=s.accept(); c.settimeout(8); n=0\n\
             while True:\n    b=c.recv(65536)\n    if not b: break\n    n+=len(b)\n\
             c.sendall(str(n).encode()); c.close()"
        );
        let mut srv = Command::new("ip")
            .args([
                "netns",
                "exec",
                "sp-tfw-h1",
                "timeout",
                "10",
                "python3",
                "-c",
            ])
            .arg(&server)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let client = format!(
            "import socket\n\
             c=socket.create_connection(('198.18.0.1',{port}),timeout=3)\n\
             c.sendall(bytes(300000)); c.shutdown(socket.SHUT_WR); print(c.recv(64).decode())"
        );
        let got = text(&lab.exec("h2", &["timeout", "8", "python3", "-c", &client]));
        // A listener never reached ends at its own timeout; this ends its wait.
        let _ = srv.kill();
        let _ = srv.wait();
        got
    };
    let admitted = inbound(5309);
    assert!(admitted.starts_with("300000"), "{admitted}");
    let refused = inbound(5310);
    assert!(!refused.starts_with("300000"), "{refused}");
    let ping = |from: &str, to: &str| {
        text(&lab.exec(from, &["ping", "-c", "2", "-i", "0.2", "-W", "1", to]))
    };
    assert!(ping("h1", "198.18.0.2").contains("2 received"));
    let refused = ping("h2", "198.18.0.1");
    assert!(refused.contains(" 0 received"), "{refused}");
    iperf3(&lab, &["-n", "50M"], 4, || {});
    let (sent, received) = exact_transfer(&lab, 8 << 20, 5308);
    assert_eq!(sent, received, "every byte through the firewall");
    std::thread::sleep(Duration::from_millis(300));
    let unsolicited = drops(&lab, "s1", "unsolicited");
    assert!(unsolicited >= 2, "h2's pings are counted: {unsolicited}");
    // Real TCP (window scaling, SACK, timestamps, four streams) stays within its windows:
    // the window checks refuse none of it (drops are listed once counted).
    // (Every reason is listed from the first scrape, at 0 until it counts.)
    let metrics = metric_lines(&lab, "s1");
    assert!(
        metrics.contains("stateplane_drops_total{reason=\"out_of_window\"} 0\n"),
        "no segment of real TCP refused:\n{metrics}"
    );
    let connections = text(&ctl(&lab, &["read", "connections"]));
    assert!(
        connections.contains("dst_port=5308") || connections.contains("src_port=5308"),
        "the transfer's connection is tracked:\n{connections}"
    );
}

/// The firewall judged against Linux's: the same crafted packets cross first a stateplane
/// `firewall` in s1, then a Linux bridge in s1 filtering with iptables and conntrack as a
/// transparent firewall is set up (`bridge-nf-call-iptables`; FORWARD drops all but
/// ESTABLISHED and RELATED, and NEW from the inside port; `nf_conntrack_tcp_loose = 0`,
/// since the firewall opens TCP on a SYN alone; the same short timeouts on both). Each
/// packet's fate (did it reach the other side?) must be what both decide: TCP through its
/// states with data in and out of the window, acknowledgements of data never sent, resets
/// in and out of the window, a port reused after both FINs, ICMP errors genuine and forged
/// about TCP, UDP and ping, unsolicited packets, and every kind of connection idle past its
/// timeout against one idle within it. Where the two differ on purpose the step says why.
/// The packets come from addresses no host has (h1 and h2 answer none of them), each with
/// its own IP identification, and are told apart by it in captures taken on h1 and h2.
#[test]
fn the_firewall_decides_as_linux_conntrack_does_packet_for_packet() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for t in ["iptables", "tcpdump", "sysctl"] {
        require(t);
    }
    let script = conntrack_script();
    let lab = Lab::up_edited("line.toml", "tfwdiff", None, |t| {
        t.replace(
            "name = \"forward\"",
            "name = \"firewall\"\n[switch.program.firewall]\ntimeouts = { new = 2, syn_recv = 2, \
             established = 3, udp = 2, udp_stream = 2, icmp = 2 }",
        )
    });
    let dir = lab.file.with_extension("steps");
    std::fs::create_dir_all(&dir).unwrap();
    let ours = crossings(&lab, &script, &dir.join("stateplane"));
    // What the firewall counted, for the table: its drops by reason.
    let counted: Vec<String> = metric_lines(&lab, "s1")
        .lines()
        .filter(|l| l.starts_with("stateplane_drops_total") && !l.ends_with(" 0"))
        .map(str::to_owned)
        .collect();

    // s1 again, as Linux: its switch stopped, a bridge between the same two ports.
    stop_switch(&lab, "s1");
    for command in [
        "ip link add br0 type bridge forward_delay 0",
        "ip link set p0 master br0",
        "ip link set p1 master br0",
        "ip link set br0 up",
        "sysctl -qw net.bridge.bridge-nf-call-iptables=1",
        "iptables -P FORWARD DROP",
        "iptables -A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        "iptables -A FORWARD -m physdev --physdev-in p0 -m conntrack --ctstate NEW -j ACCEPT",
        "sysctl -qw net.netfilter.nf_conntrack_tcp_loose=0",
        "sysctl -qw net.netfilter.nf_conntrack_tcp_timeout_syn_sent=2",
        "sysctl -qw net.netfilter.nf_conntrack_tcp_timeout_syn_recv=2",
        "sysctl -qw net.netfilter.nf_conntrack_tcp_timeout_established=3",
        "sysctl -qw net.netfilter.nf_conntrack_udp_timeout=2",
        "sysctl -qw net.netfilter.nf_conntrack_udp_timeout_stream=2",
        "sysctl -qw net.netfilter.nf_conntrack_icmp_timeout=2",
    ] {
        let out = lab.exec("s1", &command.split(' ').collect::<Vec<_>>());
        assert!(out.status.success(), "{command}:\n{}", text(&out));
    }
    let linux = crossings(&lab, &script, &dir.join("linux"));

    let mut table = String::from("step  linux  stateplane  expected  packet\n");
    let mut wrong = Vec::new();
    let fate = |crossed: bool| if crossed { "pass" } else { "drop" };
    for (i, step) in script.steps().enumerate() {
        let linux_expected = step.passes ^ step.linux_differs.is_some();
        table += &format!(
            "{i:4}  {:5}  {:10}  {:8}  {}{}\n",
            fate(linux[i]),
            fate(ours[i]),
            fate(step.passes),
            step.what,
            step.linux_differs
                .map_or(String::new(), |why| format!(" (Linux: {why})")),
        );
        if ours[i] != step.passes || linux[i] != linux_expected {
            wrong.push(i);
        }
    }
    table += &format!("stateplane's drops:\n{}\n", counted.join("\n"));
    println!("{table}");
    assert!(wrong.is_empty(), "steps {wrong:?} went otherwise:\n{table}");
}

/// One crafted packet of a differential run.
struct Step {
    from_inside: bool,
    frame: Vec<u8>,
    what: String,
    /// Whether a stateful firewall lets it cross.
    passes: bool,
    /// Why Linux decides otherwise, where it does on purpose.
    linux_differs: Option<&'static str>,
}

enum Act {
    Send(Step),
    Wait(Duration),
}

/// Packets and pauses, in order; each packet's IP identification is its own.
#[derive(Default)]
struct Script {
    acts: Vec<Act>,
}

/// The crafted packets' endpoints: a client behind the firewall, a server and a router
/// beyond it (addresses h1 and h2 do not have).
const CLIENT: [u8; 4] = [198, 18, 0, 11];
const SERVER: [u8; 4] = [198, 18, 0, 12];
const ROUTER: [u8; 4] = [198, 18, 0, 13];

impl Script {
    /// Adds a packet; its IP identification becomes 0x5300 plus its step's number.
    fn send(&mut self, from_inside: bool, mut frame: Vec<u8>, what: &str, passes: bool) {
        let ident = 0x5300 + self.steps().count() as u16;
        frame[18..20].copy_from_slice(&ident.to_be_bytes());
        stateplane_wire::ipv4::Ipv4Packet::new_unchecked(&mut frame[14..]).fill_checksum();
        self.acts.push(Act::Send(Step {
            from_inside,
            frame,
            what: what.to_owned(),
            passes,
            linux_differs: None,
        }));
    }

    /// Marks the last packet as one Linux decides otherwise, and why.
    fn linux_differs(&mut self, why: &'static str) {
        if let Some(Act::Send(step)) = self.acts.last_mut() {
            step.linux_differs = Some(why);
        }
    }

    fn wait(&mut self, seconds: f64) {
        self.acts.push(Act::Wait(Duration::from_secs_f64(seconds)));
    }

    fn steps(&self) -> impl Iterator<Item = &Step> {
        self.acts.iter().filter_map(|a| match a {
            Act::Send(step) => Some(step),
            Act::Wait(_) => None,
        })
    }
}

/// The link and network layers of a packet between `src` and `dst`.
fn crafted_hosts(src: [u8; 4], dst: [u8; 4]) -> stateplane_gen::build::Hosts {
    let mac = |a: [u8; 4]| stateplane_wire::MacAddr([2, 0, 0, 0, 2, a[3]]);
    stateplane_gen::build::Hosts {
        src_mac: mac(src),
        dst_mac: mac(dst),
        vlan: 0,
        src: std::net::Ipv4Addr::from(src).into(),
        dst: std::net::Ipv4Addr::from(dst).into(),
        ttl: 64,
    }
}

/// A frame between the client and the server, from the client when `from_inside`.
fn crafted(from_inside: bool, l4: stateplane_gen::build::L4, payload_len: usize) -> Vec<u8> {
    let hosts = if from_inside {
        crafted_hosts(CLIENT, SERVER)
    } else {
        crafted_hosts(SERVER, CLIENT)
    };
    let mut frame = Vec::new();
    stateplane_gen::build::emit_frame(&mut frame, &hosts, &l4, &vec![0x5a; payload_len]);
    frame
}

/// A TCP segment of the connection between the client's port and the server's
/// (`ports`), from the client when `from_inside`, with `len` bytes of data.
fn segment(
    from_inside: bool,
    ports: (u16, u16),
    seq: u32,
    ack: u32,
    flags: u8,
    len: usize,
) -> Vec<u8> {
    let (src_port, dst_port) = if from_inside {
        ports
    } else {
        (ports.1, ports.0)
    };
    let l4 = stateplane_gen::build::L4::Tcp {
        src_port,
        dst_port,
        seq,
        ack,
        flags,
    };
    crafted(from_inside, l4, len)
}

fn datagram(from_inside: bool, ports: (u16, u16)) -> Vec<u8> {
    let (src_port, dst_port) = if from_inside {
        ports
    } else {
        (ports.1, ports.0)
    };
    crafted(
        from_inside,
        stateplane_gen::build::L4::Udp { src_port, dst_port },
        20,
    )
}

fn echo(from_inside: bool, request: bool, ident: u16) -> Vec<u8> {
    let l4 = stateplane_gen::build::L4::IcmpEcho {
        request,
        ident,
        seq: 1,
    };
    crafted(from_inside, l4, 16)
}

/// An ICMP error from `src` to the client (type, code) about `about` (a frame the client
/// sent): its IP header and 8 bytes more, quoted.
fn error_about(src: [u8; 4], (icmp_type, code): (u8, u8), about: &[u8]) -> Vec<u8> {
    use stateplane_gen::build::{IcmpError, emit_icmp_error};
    let error = IcmpError {
        icmp_type,
        code,
        mtu: if (icmp_type, code) == (3, 4) { 1280 } else { 0 },
    };
    let mut frame = Vec::new();
    emit_icmp_error(
        &mut frame,
        &crafted_hosts(src, CLIENT),
        error,
        &about[14..14 + 28],
    );
    frame
}

/// What the firewall and Linux are both put through.
fn conntrack_script() -> Script {
    use stateplane_wire::tcp::flags::{ACK, FIN, PSH, RST, SYN};
    const IN: bool = true;
    const OUT: bool = false;
    const PASS: bool = true;
    const DROP: bool = false;
    let (frag_needed, port_unreachable, time_exceeded) = ((3, 4), (3, 3), (11, 0));
    let mut s = Script::default();

    // A: a connection through its handshake and data both ways, then packets off its
    // windows, errors genuine and forged, and a reset that ends it.
    let a = (40001, 80);
    s.send(IN, segment(IN, a, 1000, 0, SYN, 0), "A: SYN", PASS);
    s.send(
        OUT,
        segment(OUT, a, 900_000, 1001, SYN | ACK, 0),
        "A: SYN+ACK",
        PASS,
    );
    s.send(IN, segment(IN, a, 1001, 900_001, ACK, 0), "A: ACK", PASS);
    s.send(
        IN,
        segment(IN, a, 1001, 900_001, PSH | ACK, 100),
        "A: 100 bytes out",
        PASS,
    );
    s.send(
        OUT,
        segment(OUT, a, 900_001, 1101, PSH | ACK, 100),
        "A: 100 bytes in",
        PASS,
    );
    s.send(
        OUT,
        segment(OUT, a, 1_900_101, 1101, PSH | ACK, 100),
        "A: data 1,000,000 past the window",
        DROP,
    );
    s.send(
        OUT,
        segment(OUT, a, 900_101, 1_001_101, ACK, 0),
        "A: acknowledges 1,000,000 bytes never sent",
        DROP,
    );
    s.send(
        OUT,
        segment(OUT, a, 2_900_101, 0, RST, 0),
        "A: RST 2,000,000 past the window",
        DROP,
    );
    let sent = segment(IN, a, 1101, 900_101, ACK, 0);
    s.send(
        OUT,
        error_about(ROUTER, frag_needed, &sent),
        "A: fragmentation needed about its segment",
        PASS,
    );
    s.send(
        OUT,
        error_about(
            SERVER,
            port_unreachable,
            &segment(IN, (40099, 80), 1000, 0, SYN, 0),
        ),
        "port unreachable about a connection never opened",
        DROP,
    );
    s.send(
        OUT,
        error_about(
            ROUTER,
            frag_needed,
            &segment(IN, a, 3_001_101, 900_101, ACK, 0),
        ),
        "A: fragmentation needed about a segment the client never sent",
        DROP,
    );
    s.linux_differs(
        "does not hold an error's quoted segment to the windows; the firewall does, as pf \
         does, so that a forged error must guess a sequence number too",
    );
    s.send(IN, sent, "A: acknowledges the 100 bytes", PASS);
    s.send(
        OUT,
        segment(OUT, a, 905_101, 1101, RST, 0),
        "A: RST within the window, 5000 past the next byte",
        PASS,
    );
    s.send(
        OUT,
        segment(OUT, a, 900_101, 1101, PSH | ACK, 10),
        "A: data after it: the connection goes on",
        PASS,
    );
    s.send(
        OUT,
        segment(OUT, a, 900_061, 1101, RST, 0),
        "A: RST 50 before what the client acknowledged",
        PASS,
    );
    s.linux_differs(
        "drops a reset before what its receiver acknowledged; the firewall places it as pf \
         does, as hosts reset stale segments so, and it ends nothing",
    );
    s.send(
        OUT,
        segment(OUT, a, 900_111, 1101, RST, 0),
        "A: RST at the next byte",
        PASS,
    );
    s.send(
        OUT,
        segment(OUT, a, 900_111, 1101, PSH | ACK, 10),
        "A: data after the reset",
        DROP,
    );
    s.linux_differs(
        "keeps a reset connection in CLOSE for nf_conntrack_tcp_timeout_close (10 s) and \
         passes its packets; the firewall forgets it at once",
    );
    s.send(
        OUT,
        segment(OUT, (40005, 80), 1, 1, RST, 0),
        "RST from outside to no connection",
        DROP,
    );
    s.send(
        IN,
        segment(IN, (40006, 80), 1, 1, RST, 0),
        "RST from inside to no connection",
        PASS,
    );
    s.linux_differs(
        "judges a reset of no connection INVALID; the firewall lets the inside's resets out \
         (they only ever close things: a host's repeated resets of a connection just ended)",
    );

    // B: both FINs, the server sending on after the client's (half closed), then the
    // client's port reused.
    let b = (40002, 443);
    s.send(IN, segment(IN, b, 5000, 0, SYN, 0), "B: SYN", PASS);
    s.send(
        OUT,
        segment(OUT, b, 7000, 5001, SYN | ACK, 0),
        "B: SYN+ACK",
        PASS,
    );
    s.send(IN, segment(IN, b, 5001, 7001, ACK, 0), "B: ACK", PASS);
    s.send(
        IN,
        segment(IN, b, 5001, 7001, FIN | ACK, 0),
        "B: client's FIN",
        PASS,
    );
    s.send(
        OUT,
        segment(OUT, b, 7001, 5002, PSH | ACK, 50),
        "B: server sends on, half closed",
        PASS,
    );
    s.send(IN, segment(IN, b, 5002, 7051, ACK, 0), "B: ACK", PASS);
    s.send(
        OUT,
        segment(OUT, b, 7051, 5002, FIN | ACK, 0),
        "B: server's FIN",
        PASS,
    );
    s.send(IN, segment(IN, b, 5002, 7052, ACK, 0), "B: last ACK", PASS);
    s.send(
        IN,
        segment(IN, b, 100_000, 0, SYN, 0),
        "B: SYN reusing the ports",
        PASS,
    );
    s.send(
        OUT,
        segment(OUT, b, 300_000, 100_001, SYN | ACK, 0),
        "B: SYN+ACK again",
        PASS,
    );

    // What opens nothing.
    s.send(
        OUT,
        segment(OUT, (22, 50000), 1, 0, SYN, 0),
        "SYN from outside",
        DROP,
    );
    s.send(
        IN,
        segment(IN, (40003, 80), 1, 1, ACK, 0),
        "ACK from inside, no SYN",
        DROP,
    );
    s.send(
        OUT,
        segment(OUT, (40004, 80), 1, 1, SYN | ACK, 0),
        "SYN+ACK to no SYN",
        DROP,
    );

    // UDP and ping, with errors about them.
    let dns = (5353, 53);
    let query = datagram(IN, dns);
    s.send(IN, query.clone(), "UDP: query", PASS);
    s.send(OUT, datagram(OUT, dns), "UDP: answer", PASS);
    s.send(OUT, datagram(OUT, (5354, 53)), "UDP: to another port", DROP);
    s.send(
        OUT,
        error_about(SERVER, port_unreachable, &query),
        "UDP: port unreachable about the query",
        PASS,
    );
    s.send(
        OUT,
        error_about(SERVER, port_unreachable, &datagram(IN, (5999, 53))),
        "UDP: port unreachable about no query",
        DROP,
    );
    let request = echo(IN, true, 77);
    s.send(IN, request.clone(), "ping: request", PASS);
    s.send(OUT, echo(OUT, false, 77), "ping: reply", PASS);
    s.send(OUT, echo(OUT, false, 78), "ping: reply to no request", DROP);
    s.send(
        OUT,
        error_about(ROUTER, time_exceeded, &request),
        "ping: time exceeded about the request",
        PASS,
    );
    s.send(OUT, echo(OUT, true, 79), "ping: request from outside", DROP);

    // Timeouts: each kind of connection idle past its own (2 s, established 3 s), beside
    // an established one kept busy within it.
    let (c, d, e) = ((40010, 80), (40011, 80), (40012, 80));
    s.send(IN, segment(IN, c, 10, 0, SYN, 0), "C: SYN", PASS);
    for (ports, what) in [(d, "D"), (e, "E")] {
        s.send(
            IN,
            segment(IN, ports, 10, 0, SYN, 0),
            &format!("{what}: SYN"),
            PASS,
        );
        s.send(
            OUT,
            segment(OUT, ports, 20, 11, SYN | ACK, 0),
            &format!("{what}: SYN+ACK"),
            PASS,
        );
        s.send(
            IN,
            segment(IN, ports, 11, 21, ACK, 0),
            &format!("{what}: ACK"),
            PASS,
        );
    }
    s.send(IN, datagram(IN, (6000, 53)), "UDP: query, then quiet", PASS);
    s.send(IN, echo(IN, true, 80), "ping: request, then quiet", PASS);
    s.wait(2.0);
    s.send(
        OUT,
        segment(OUT, e, 21, 11, PSH | ACK, 10),
        "E: data within its timeout",
        PASS,
    );
    s.wait(1.5);
    s.send(
        OUT,
        segment(OUT, e, 31, 11, PSH | ACK, 10),
        "E: data within its timeout",
        PASS,
    );
    s.send(
        OUT,
        segment(OUT, c, 20, 11, SYN | ACK, 0),
        "C: SYN+ACK after its timeout",
        DROP,
    );
    s.send(
        OUT,
        segment(OUT, d, 21, 11, PSH | ACK, 10),
        "D: data after its timeout",
        DROP,
    );
    s.send(
        OUT,
        datagram(OUT, (6000, 53)),
        "UDP: answer after its timeout",
        DROP,
    );
    s.send(
        OUT,
        echo(OUT, false, 80),
        "ping: reply after its timeout",
        DROP,
    );
    s
}

/// Sends `script`'s packets into s1 from h1 (the inside) and h2, one by one, and tells
/// which crossed: seen by a capture on the other side. Keeps its files under `dir`.
fn crossings(lab: &Lab, script: &Script, dir: &Path) -> Vec<bool> {
    std::fs::create_dir_all(dir).unwrap();
    let capture = |node: &str| {
        let file = dir.join(format!("{node}.pcap"));
        let mut child = Command::new("ip")
            .args(["netns", "exec", &format!("sp-{}-{node}", lab.name)])
            // Immediate mode: else libpcap holds packets in a block for up to a second,
            // and the last ones before the capture stops are lost.
            .args([
                "tcpdump",
                "-i",
                "eth0",
                "-Q",
                "in",
                "--immediate-mode",
                "-U",
                "-n",
            ])
            .arg("-w")
            .arg(&file)
            .arg("ip")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        let stderr = child.stderr.take().unwrap();
        BufReader::new(stderr).read_line(&mut first).unwrap();
        assert!(first.contains("listening on"), "tcpdump in {node}: {first}");
        (child, file)
    };
    let (inside, inside_file) = capture("h1");
    let (outside, outside_file) = capture("h2");
    for (i, act) in script.acts.iter().enumerate() {
        match act {
            Act::Wait(d) => std::thread::sleep(*d),
            Act::Send(step) => {
                let file = dir.join(format!("{i}.pcap"));
                let mut w = stateplane_io::pcap::PcapWriter::new(
                    std::fs::File::create(&file).unwrap(),
                    true,
                )
                .unwrap();
                w.write(0, &step.frame, step.frame.len() as u32).unwrap();
                drop(w);
                let node = if step.from_inside { "h1" } else { "h2" };
                let out = lab.exec(
                    node,
                    &[
                        env!("CARGO_BIN_EXE_stateplane"),
                        "send",
                        "-I",
                        "eth0",
                        &file.to_string_lossy(),
                    ],
                );
                assert!(out.status.success(), "send from {node}:\n{}", text(&out));
                // Each packet judged before the next comes, whichever port it comes on.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let idents = |mut child: std::process::Child, file: &Path| {
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        assert!(
            child.wait().unwrap().code() == Some(0),
            "tcpdump ended badly"
        );
        stateplane_io::capture::read_all(file)
            .unwrap()
            .into_iter()
            .filter(|(_, f, _)| {
                f.len() >= 34 && [CLIENT, SERVER, ROUTER].iter().any(|a| f[26..30] == *a)
            })
            .map(|(_, f, _)| u16::from_be_bytes([f[18], f[19]]))
            .collect::<std::collections::HashSet<u16>>()
    };
    let reached_inside = idents(inside, &inside_file);
    let reached_outside = idents(outside, &outside_file);
    script
        .steps()
        .map(|step| {
            let ident = u16::from_be_bytes([step.frame[18], step.frame[19]]);
            if step.from_inside {
                reached_outside.contains(&ident)
            } else {
                reached_inside.contains(&ident)
            }
        })
        .collect()
}

/// `lb` on live ports: h1's connections to the VIP are spread over h2 and h3 and each is
/// answered whole; once h3 is marked down through `ctl`, every new connection reaches h2.
/// Backends change at run time through `ctl`: h3 deleted and inserted again with weight
/// 3 takes most new connections; a backend drained keeps a connection open on it while
/// every new one goes to the other. iperf3's streams (a VIP with client affinity) all
/// meet one backend.
#[test]
fn a_load_balancer_spreads_connections_and_its_backends_change_at_run_time() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up("line-lb.toml", "tlb");
    // Each backend answers every connection with its name, for up to 40 s.
    let spawn_in = |host: &str, command: &[&str]| {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &format!("sp-{}-{host}", lab.name),
                "timeout",
                "60",
            ])
            .args(command)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    // Each backend answers a connection with its name, and again each time the client
    // writes, until the client closes.
    let mut servers: Vec<std::process::Child> = ["h2", "h3"]
        .iter()
        .map(|&host| {
            let code = format!(
                "import socket,threading\n\
                 s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
                 s.bind(('0.0.0.0',5300)); s.listen(64); s.settimeout(40)\n\
                 def serve(c):\n    \
                 c.settimeout(30)\n    \
                 try:\n        \
                 c.sendall(b'{host}')\n        \
                 while c.recv(16): c.sendall(b'{host}')\n    \
                 except OSError: pass\n    \
                 c.close()\n\
                 while True:\n    \
                 c,a=s.accept(); threading.Thread(target=serve,args=(c,),daemon=True).start()"
            );
            spawn_in(host, &["python3", "-c", &code])
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let names = |n: usize| -> Vec<String> {
        let client = format!(
            "import socket\n\
             for i in range({n}):\n    \
             c=socket.create_connection(('198.18.0.100',5300),timeout=3)\n    \
             print(c.recv(16).decode()); c.close()"
        );
        let out = lab.exec("h1", &["timeout", "30", "python3", "-c", &client]);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let spread = names(40);
    assert_eq!(spread.len(), 40, "every connection answered");
    let on = |host: &str, of: &[String]| of.iter().filter(|n| *n == host).count();
    assert!(
        on("h2", &spread) >= 5 && on("h3", &spread) >= 5,
        "both backends serve: {spread:?}"
    );
    let down = ctl(
        &lab,
        &[
            "modify",
            "backends",
            "address=198.18.0.3",
            "port=5300",
            "proto=6",
            "down",
        ],
    );
    assert!(down.status.success(), "{}", text(&down));
    let spared = names(20);
    assert_eq!(on("h2", &spared), 20, "h3 is spared: {spared:?}");
    let backends = text(&ctl(&lab, &["read", "backends"]));
    assert!(
        backends.contains("address=198.18.0.3 port=5300 proto=6 down"),
        "{backends}"
    );

    // Deleted, h3 is gone from the table; inserted again with weight 3 (as an operator
    // adds a server), it takes about three new connections in four.
    let h3 = ["address=198.18.0.3", "port=5300", "proto=6"];
    let ok = |args: &[&str]| {
        let out = ctl(&lab, args);
        assert!(out.status.success(), "ctl {args:?}: {}", text(&out));
        text(&out)
    };
    ok(&[&["delete", "backends"][..], &h3].concat());
    let backends = ok(&["read", "backends"]);
    assert!(!backends.contains("198.18.0.3 port=5300"), "{backends}");
    let settings = [
        "up",
        "vip=198.18.0.100",
        "vip_port=5300",
        "weight=3",
        "via=2",
        "mac=02:00:00:00:01:03",
    ];
    ok(&[&["insert", "backends"][..], &h3, &settings].concat());
    let weighted = names(40);
    assert!(on("h3", &weighted) >= 22, "weight 3 of 4: {weighted:?}");

    // A connection held open on one backend, which is then drained: new connections go
    // to the other, and the held one is still answered by its own.
    let held_client = "import socket,sys\n\
         c=socket.create_connection(('198.18.0.100',5300),timeout=10)\n\
         print(c.recv(16).decode(),flush=True)\n\
         sys.stdin.readline()\n\
         c.sendall(b'again'); print(c.recv(16).decode(),flush=True)";
    let mut held = Command::new("ip")
        .args(["netns", "exec", &format!("sp-{}-h1", lab.name)])
        .args(["timeout", "30", "python3", "-c", held_client])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut answers = BufReader::new(held.stdout.take().unwrap());
    let mut first = String::new();
    answers.read_line(&mut first).unwrap();
    let first = first.trim().to_string();
    let (drained, other) = match first.as_str() {
        "h2" => ("198.18.0.2", "h3"),
        "h3" => ("198.18.0.3", "h2"),
        _ => panic!("the held connection was answered by {first:?}"),
    };
    let address = format!("address={drained}");
    ok(&[
        "modify",
        "backends",
        &address,
        "port=5300",
        "proto=6",
        "drain",
    ]);
    let backends = ok(&["read", "backends"]);
    assert!(
        backends.contains(&format!(
            "{address} port=5300 proto=6 drain vip=198.18.0.100"
        )),
        "the drain kept the backend's settings: {backends}"
    );
    let after_drain = names(20);
    assert_eq!(on(other, &after_drain), 20, "{after_drain:?}");
    use std::io::Write as _;
    writeln!(held.stdin.take().unwrap()).unwrap();
    let mut second = String::new();
    answers.read_line(&mut second).unwrap();
    assert_eq!(
        second.trim(),
        first,
        "the drained backend kept its connection"
    );
    assert!(held.wait().unwrap().success());
    let stats = ok(&["stats", "backends"]);
    assert!(stats.contains("drain"), "{stats}");
    for server in &mut servers {
        let _ = server.kill();
        let _ = server.wait();
    }
    // iperf3: one server per backend, one of which the client's streams all reach.
    let mut iperf_servers: Vec<std::process::Child> = [("h2", "198.18.0.2"), ("h3", "198.18.0.3")]
        .iter()
        .map(|&(host, addr)| spawn_in(host, &["iperf3", "-s", "-1", "-B", addr]))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let out = lab.exec(
        "h1",
        &[
            "timeout",
            "60",
            "iperf3",
            "-c",
            "198.18.0.100",
            "-n",
            "50M",
            "-P",
            "4",
            "-J",
        ],
    );
    for server in &mut iperf_servers {
        let _ = server.kill();
        let _ = server.wait();
    }
    assert!(out.status.success(), "iperf3 through lb:\n{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sent = report["end"]["sum_sent"]["bytes"].as_u64().unwrap();
    assert!(sent >= mib(50), "iperf3 sent {sent}");
    let connections = text(&ctl(&lab, &["read", "connections"]));
    let iperf_backends: std::collections::BTreeSet<&str> = connections
        .lines()
        .filter(|l| l.contains("dst_port=5201"))
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("backend=")))
        .collect();
    assert_eq!(iperf_backends.len(), 1, "{connections}");
}

/// Runs `stateplane ctl ARGS` in the switch's namespace (the control API is on the
/// switch's socket in its run directory).
fn ctl(lab: &Lab, args: &[&str]) -> Output {
    let mut command = vec![env!("CARGO_BIN_EXE_stateplane"), "ctl"];
    command.extend_from_slice(args);
    lab.exec("s1", &command)
}

/// `stateplane ctl` programs a live `l2` switch: the hosts reach each other only once
/// their stations are inserted, the entries count hits, bad requests are refused with the
/// cause and change nothing, and a delete cuts the path again.
#[test]
fn ctl_programs_a_live_switch_and_streams_ageing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up_edited("line-l2.toml", "tctl", None, |t| {
        t.replace(
            "macs = [\n  { mac = \"02:00:00:00:01:01\", port = \"p0\" },\n  { mac = \"02:00:00:00:01:02\", port = \"p1\" },\n]\nunknown = \"flood\"",
            "unknown = \"drop\"",
        )
    });
    for (host, peer, mac) in [
        ("h1", "198.18.0.2", "02:00:00:00:01:02"),
        ("h2", "198.18.0.1", "02:00:00:00:01:01"),
    ] {
        let out = lab.exec(
            host,
            &["ip", "neigh", "replace", peer, "lladdr", mac, "dev", "eth0"],
        );
        assert!(out.status.success(), "{}", text(&out));
    }
    let ping = || {
        let out = lab.exec(
            "h1",
            &["ping", "-c", "3", "-i", "0.2", "-W", "1", "198.18.0.2"],
        );
        text(&out)
    };
    assert!(ping().contains(" 0 received"), "no path before the insert");

    let out = ctl(&lab, &["describe"]);
    assert!(
        text(&out).contains("table macs capacity=4096"),
        "{}",
        text(&out)
    );
    // The default endpoint: a socket in the switch's run directory that only its user
    // (root) can open; a user who is not root cannot reach the switch through it.
    let socket = stateplane_lab::namespaces::run_dir(&lab.name, "s1").join("control.sock");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", socket.display());
    let socket_arg = format!("unix:{}", socket.display());
    let as_nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        env!("CARGO_BIN_EXE_stateplane"),
        "ctl",
        "--server",
        &socket_arg,
        "describe",
    ];
    let out = lab.exec("s1", &as_nobody);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("Permission denied"), "{}", text(&out));
    // A second switch with the same run directory cannot take the control socket: it does
    // not start, rather than leave `ctl` talking to the first while its user means the
    // second.
    let second = [
        "timeout",
        "10",
        env!("CARGO_BIN_EXE_stateplane"),
        "run",
        "forward",
    ];
    let out = lab.exec("s1", &[&second[..], &["-I", "p0", "-I", "p1"]].concat());
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("--control: another process listens on")
            && text(&out).contains("s1/control.sock")
            && text(&out).contains("--control off"),
        "{}",
        text(&out)
    );
    // A station on a port the switch lacks is refused, naming the ports it has.
    let out = ctl(
        &lab,
        &[
            "insert",
            "macs",
            "vlan=0",
            "mac=02:00:00:00:01:07",
            "forward",
            "port=7",
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains("`port`: there is no port 7; the switch has ports 0 to 1"),
        "{}",
        text(&out)
    );
    let out = ctl(
        &lab,
        &[
            "insert",
            "macs",
            "vlan=0",
            "mac=02:00:00:00:01:02",
            "forward",
            "port=1",
        ],
    );
    assert!(
        text(&out).contains("inserted 1 entry of macs at version 1"),
        "{}",
        text(&out)
    );
    let file = lab.file.with_extension("entries");
    std::fs::write(&file, "# h1\nvlan=0 mac=02:00:00:00:01:01 forward port=0\n").unwrap();
    let out = ctl(&lab, &["insert", "macs", "--file", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        ping().contains("3 received"),
        "the inserted entries carry the echo"
    );

    let out = ctl(&lab, &["read", "macs"]);
    let listing = String::from_utf8_lossy(&out.stdout).to_string();
    let line = listing
        .lines()
        .find(|l| l.contains("mac=02:00:00:00:01:02"))
        .unwrap_or_else(|| panic!("h2's entry is read back:\n{}", text(&out)));
    let hits: u64 = line.rsplit("hits=").next().unwrap().parse().unwrap();
    assert!(line.contains("forward port=1") && hits >= 3, "{line}");

    // Refusals: the cause, a failing exit, and the table as it was.
    let refused = [
        (
            vec![
                "insert",
                "macs",
                "vlan=0",
                "mac=02:00:00:00:01:02",
                "forward",
                "port=1",
            ],
            "already has an entry",
        ),
        (
            vec![
                "insert",
                "macs",
                "vlan=0",
                "mac=02:00:00:00:01:03",
                "forward",
                "port=70000",
            ],
            "does not fit its 16 bits",
        ),
        (
            vec!["insert", "nope", "vlan=0"],
            "no table or register `nope`; the program has: macs",
        ),
        (
            vec!["delete", "macs", "vlan=0", "mac=02:00:00:00:09:09"],
            "has no entry with that key",
        ),
    ];
    for (args, cause) in refused {
        let out = ctl(&lab, &args);
        assert!(!out.status.success(), "{args:?} is refused");
        assert!(text(&out).contains(cause), "{args:?}: {}", text(&out));
    }
    let out = ctl(&lab, &["stats", "macs"]);
    assert!(text(&out).contains("macs.entries 2\n"), "{}", text(&out));
    // The metrics show the table against its bound.
    let metrics = metric_lines(&lab, "s1");
    common::assert_scrape_sound(&metrics, |f| {
        f.starts_with("stateplane_table_") || f.starts_with("stateplane_control_")
    });
    for line in [
        "stateplane_table_entries{table=\"macs\"} 2",
        "stateplane_table_capacity{table=\"macs\"} 4096",
        "stateplane_table_adds_refused_total{table=\"macs\",reason=\"full\"} 0",
        "stateplane_table_adds_refused_total{table=\"macs\",reason=\"rate\"} 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}: {metrics}");
    }
    // The control API's requests by method: the inserts and their refusals among them.
    let count = |family: &str, method: &str| {
        let prefix = format!("{family}{{method=\"{method}\"}} ");
        (metrics.lines())
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{prefix}: {metrics}"))
    };
    let (writes, refused) = (
        count("stateplane_control_requests_total", "WriteStream"),
        count("stateplane_control_refused_total", "WriteStream"),
    );
    assert!(writes >= 4 && (2..writes).contains(&refused), "{metrics}");
    assert!(count("stateplane_control_requests_total", "Stats") >= 1);
    assert_eq!(count("stateplane_control_refused_total", "Stats"), 0);
    // And what the table and each interface's rings hold of the memory budget.
    for setting in ["program.l2.capacity", "p0 rings", "p1 rings"] {
        let prefix = format!("stateplane_memory_share_bytes{{setting=\"{setting}\"}} ");
        let bytes = (metrics.lines())
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse::<u64>().ok());
        assert!(bytes > Some(0), "{setting}: {metrics}");
    }
    assert!(
        text(&out).contains("pipeline.rx_packets "),
        "{}",
        text(&out)
    );

    let out = ctl(&lab, &["delete", "macs", "vlan=0", "mac=02:00:00:00:01:02"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(ping().contains(" 0 received"), "no path after the delete");
    drop(lab);

    // A learning switch ageing stations out after a second: the stream reports them.
    let lab = Lab::up_edited("line-learn.toml", "tctlw", None, |t| {
        t.replace("ageing = 300", "ageing = 1")
    });
    let out = lab.exec(
        "h1",
        &["ping", "-c", "2", "-i", "0.2", "-W", "2", "198.18.0.2"],
    );
    assert!(text(&out).contains("2 received"), "{}", text(&out));
    let out = ctl(&lab, &["watch", "--count", "1", "--timeout", "20"]);
    assert!(
        text(&out).contains(" aged-out stations vlan=0 mac=02:00:00:00:01:0"),
        "{}",
        text(&out)
    );
}

/// The `pipeline` program on live ports, its rules changed through its control API while
/// traffic runs: pings cross it (TTL decremented), a higher-priority rule added with `ctl
/// add-flow` blocks them at once, `dump-flows` counts what it dropped, and deleting it by
/// cookie lets them through again.
#[test]
fn pipeline_rules_change_live_through_ctl() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up_with("line-pipeline.toml", "tpipe", None);
    let sp = env!("CARGO_BIN_EXE_stateplane");
    let ping = |count: &str| {
        text(&lab.exec(
            "h1",
            &["ping", "-c", count, "-i", "0.2", "-W", "1", "198.18.0.2"],
        ))
    };
    let ok = ping("3");
    assert!(ok.contains("3 received"), "{ok}");
    assert!(
        ok.contains("ttl=63"),
        "the switch decremented the TTL: {ok}"
    );
    let ctl = |args: &[&str]| {
        let mut command = vec![sp, "ctl"];
        command.extend_from_slice(args);
        let out = lab.exec("s1", &command);
        assert!(out.status.success(), "ctl {args:?}: {}", text(&out));
        text(&out)
    };
    ctl(&[
        "add-flow",
        "priority=100,cookie=0x77,icmp,in_port=0,actions=drop",
    ]);
    let blocked = ping("3");
    assert!(
        blocked.contains("0 received"),
        "the new rule drops echoes: {blocked}"
    );
    let dumped = ctl(&["dump-flows", "cookie=0x77"]);
    assert!(
        dumped.contains("n_packets=3,") && dumped.contains("icmp"),
        "the rule counted the three echoes it dropped: {dumped}"
    );
    // Removals stream to `ctl watch` as they happen: the delete, then a rule that no
    // packet matches, gone on its idle timeout.
    let ns = format!("sp-{}-s1", lab.name);
    let watch = Command::new("ip")
        .args(["netns", "exec", &ns])
        .env(RUN_DIR_VAR, run_dir_of(&ns))
        .args([sp, "ctl", "watch", "--count", "2", "--timeout", "20"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    ctl(&["del-flows", "cookie=0x77"]);
    let again = ping("3");
    assert!(again.contains("3 received"), "{again}");
    ctl(&[
        "add-flow",
        "priority=1,cookie=0x78,udp,tp_dst=9,idle_timeout=1,actions=drop",
    ]);
    let watched = watch.wait_with_output().unwrap();
    let events = text(&watched);
    assert!(watched.status.success(), "{events}");
    let lines: Vec<&str> = (events.lines())
        .filter(|l| l.contains("flow_removed"))
        .collect();
    assert_eq!(lines.len(), 2, "{events}");
    assert!(
        lines[0].contains("reason=delete")
            && lines[0].contains("n_packets=3,")
            && lines[0].contains("cookie=0x77"),
        "{events}"
    );
    assert!(
        lines[1].contains("reason=idle")
            && lines[1].contains("n_packets=0,")
            && lines[1].contains("cookie=0x78"),
        "{events}"
    );
    assert!(!ctl(&["dump-flows"]).contains("cookie=0x78"));
    // replace-flows: the file's rules become the pipeline's, the others are deleted.
    let rules = |dumped: &str| dumped.lines().filter(|l| l.contains("n_packets=")).count();
    let before = rules(&ctl(&["dump-flows"]));
    let file = common::tmp("replace.txt");
    std::fs::write(
        &file,
        "# one rule\npriority=1,cookie=0x79,udp,tp_dst=9,actions=drop\n",
    )
    .unwrap();
    let replaced = ctl(&["replace-flows", &file.to_string_lossy()]);
    std::fs::remove_file(&file).unwrap();
    assert!(
        replaced.contains(&format!("{before} deleted (above), 1 added, 0 kept")),
        "{replaced}"
    );
    let after = ctl(&["dump-flows"]);
    assert_eq!(rules(&after), 1, "{after}");
    assert!(after.contains("cookie=0x79"), "{after}");
}

/// Starts `stateplane ARGS FILE` in namespace `ns` (bounded by `timeout`), its output
/// captured, and gives it time to open its ports.
fn start_in(ns: &str, args: &[&str], file: &std::path::Path) -> std::process::Child {
    let file = file.to_string_lossy();
    let mut args = args.to_vec();
    args.push(&file);
    let child = spawn_in(ns, &args);
    std::thread::sleep(Duration::from_millis(1500));
    child
}

/// The run directory of the node whose namespace is `ns` (`sp-LAB-NODE`), as `stateplane
/// lab exec` gives it: a switch's holds its control socket, so `ctl` there reaches it.
fn run_dir_of(ns: &str) -> PathBuf {
    let (lab, node) = (ns.strip_prefix("sp-"))
        .and_then(|rest| rest.rsplit_once('-'))
        .unwrap_or_else(|| panic!("{ns} is not a lab's namespace"));
    stateplane_lab::namespaces::run_dir(lab, node)
}

/// `stateplane ARGS` started in namespace `ns`, ended by `timeout` after 60 s if not before.
fn spawn_in(ns: &str, args: &[&str]) -> std::process::Child {
    Command::new("ip")
        .args(["netns", "exec", ns, "timeout", "60"])
        .env(RUN_DIR_VAR, run_dir_of(ns))
        .arg(env!("CARGO_BIN_EXE_stateplane"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// `stateplane ctl sync ARGS` (a sketch application) started on s1, against the collector
/// API of [`synced_beside_collector`].
fn sketch_app_in(lab: &Lab, args: &[&str]) -> std::process::Child {
    let mut command = vec!["ctl", "-s", "127.0.0.1:9570", "sync"];
    command.extend_from_slice(args);
    spawn_in(&format!("sp-{}-s1", lab.name), &command)
}

/// Waits until a sketch application started by [`spawn_in`] says it watches (its sketch
/// reset, its first interval begun), so that traffic sent after this call is counted in
/// its intervals; then its whole output, standard error with its first line, once it ends.
fn once_watching(mut app: std::process::Child) -> impl FnOnce() -> Output {
    let mut err = BufReader::new(app.stderr.take().unwrap());
    let mut first = String::new();
    while !first.contains("watching") {
        first.clear();
        assert!(
            err.read_line(&mut first).unwrap() > 0,
            "the application ended: {first}"
        );
    }
    move || {
        let mut out = app.wait_with_output().unwrap();
        let mut rest = String::new();
        err.read_to_string(&mut rest).unwrap();
        out.stderr = (first + &rest).into_bytes();
        out
    }
}

/// Stops a run started by [`start_in`] as an operator would, with SIGINT, once the last
/// packets have had time to arrive; its output. The run (the child of `timeout`) gets it
/// twice, 50 ms apart, as under `timeout` it may (a Ctrl-C reaches `timeout` and the run,
/// and `timeout` passes its own on, to the run and to its group): one request to stop and
/// drain, not a second one that would end it at once with its records unwritten.
fn interrupt(child: std::process::Child) -> Output {
    std::thread::sleep(Duration::from_millis(300));
    let run = run_of(&child);
    assert!(kill("-INT", &run), "kill -INT {run}");
    std::thread::sleep(Duration::from_millis(50));
    // The second may come after the run has drained and gone.
    kill("-INT", &run);
    child.wait_with_output().unwrap()
}

/// Sends `signal` (`-INT`, `-STOP`, ...) to process `pid`: whether it was delivered.
fn kill(signal: &str, pid: &str) -> bool {
    (Command::new("kill").args([signal, pid]).status()).is_ok_and(|s| s.success())
}

/// The process id of a run started by [`start_in`] (the child of its `timeout`).
fn run_of(child: &std::process::Child) -> String {
    require("pgrep");
    let timeout = child.id().to_string();
    let run = Command::new("pgrep")
        .args(["-P", &timeout])
        .output()
        .unwrap();
    let run = String::from_utf8_lossy(&run.stdout).trim().to_string();
    assert!(
        !run.is_empty(),
        "the run under timeout {timeout} has ended early"
    );
    run
}

/// `stateplane flows` on a host's own interface is a passive monitor: the host's pings and
/// TCP go on undisturbed (AF_XDP would take its packets away), and a real TCP connection
/// is recorded whole, both directions in one biflow opened by the client. A monitor that
/// falls behind by more than its ring holds (here, stopped through a transfer with the
/// smallest ring) says how many packets the kernel dropped, and still writes its records.
#[test]
fn flows_on_a_live_host_interface_record_real_tcp_both_ways() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up("line.toml", "tflows");
    let csv = common::tmp("lab-flows.csv");
    let ns = format!("sp-{}-h2", lab.name);
    let monitor = start_in(
        &ns,
        &["flows", "-I", "eth0", "--biflow", "--summary-json", "--csv"],
        &csv,
    );
    let out = lab.exec(
        "h1",
        &["ping", "-c", "3", "-i", "0.2", "-W", "2", "198.18.0.2"],
    );
    assert!(text(&out).contains("3 received"), "{}", text(&out));
    let (sent, received) = exact_transfer(&lab, 8 << 20, 5307);
    assert_eq!(sent, received, "every byte with the monitor on");
    // The connection's record is written while the monitor runs, once both FINs are seen.
    let written_live = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        std::fs::read_to_string(&csv).is_ok_and(|rows| rows.contains(",5307,"))
    });
    assert!(written_live, "no record of the connection before the stop");
    let out = interrupt(monitor);
    assert!(out.status.success(), "monitor: {}", text(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ports = summary["port_counters"].clone();
    let summary = &summary["flows"];
    let rows = std::fs::read_to_string(&csv).unwrap();
    let _ = std::fs::remove_file(&csv);
    let mut lines = rows.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<std::collections::HashMap<&str, &str>> = lines
        .map(|l| header.iter().copied().zip(l.split(',')).collect())
        .collect();
    assert_eq!(summary["records"], rows.len() as u64, "{summary}");
    let connection: Vec<_> = (rows.iter())
        .filter(|r| r["dst_port"] == "5307" || r["src_port"] == "5307")
        .collect();
    // The whole connection in one record. What comes after both FINs ended it makes a
    // record of its own (as nfpcapd's): the last ACK of the close, and on a busy machine
    // a retransmitted FIN and its ACK (seen in CI: `.AP..F` twice, `.A....` once), but
    // never a SYN or more than a few packets.
    type Row<'a> = &'a std::collections::HashMap<&'a str, &'a str>;
    let (whole, after): (Vec<Row>, Vec<Row>) =
        (connection.iter().copied()).partition(|r| r["end_reason"] == "end_of_flow");
    assert_eq!(whole.len(), 1, "one record: {connection:?}");
    let count = |r: Row, key: &str| r[key].parse::<u64>().unwrap_or(0);
    assert!(
        after.iter().all(|&r: &Row| !r["tcp_flags"].contains('S')
            && !r.get("rev_tcp_flags").is_some_and(|f| f.contains('S'))
            && count(r, "packets") + count(r, "rev_packets") <= 4),
        "only the close's last packets after it: {after:?}"
    );
    let c = whole[0];
    assert_eq!(
        (c["src"], c["dst"], c["dst_port"]),
        ("198.18.0.1", "198.18.0.2", "5307"),
        "the client's side is forward: {c:?}"
    );
    assert_eq!(
        ports["eth0"]["rx_kernel_drops"], 0,
        "the monitor's ring held it all: {ports}"
    );
    let bytes: u64 = c["bytes"].parse().unwrap();
    let back: u64 = c["rev_packets"].parse().unwrap();
    assert!(
        bytes > 8 << 20,
        "the data with its headers: {c:?}; the ports: {ports}"
    );
    assert!(back > 10, "the acks came back: {c:?}");
    // One ping's requests and replies are one biflow: three echoes each way.
    let pings: Vec<Row> = rows.iter().filter(|r| r["proto"] == "1").collect();
    assert_eq!(
        pings.len(),
        1,
        "the requests and their replies are one record: {pings:?}"
    );
    let count = |r: Row, key: &str| r[key].parse::<u64>().unwrap();
    assert_eq!(
        (count(pings[0], "packets"), count(pings[0], "rev_packets")),
        (3, 3),
        "three echoes each way: {pings:?}"
    );

    let behind = start_in(
        &ns,
        &[
            "flows",
            "-I",
            "eth0",
            "--capture-buffer",
            "1M",
            "--summary-json",
            "--csv",
        ],
        &csv,
    );
    let run = run_of(&behind);
    assert!(kill("-STOP", &run), "kill -STOP {run}");
    let (sent, received) = exact_transfer(&lab, 8 << 20, 5308);
    assert_eq!(sent, received, "every byte with the monitor stopped");
    assert!(kill("-CONT", &run), "kill -CONT {run}");
    let out = interrupt(behind);
    let _ = std::fs::remove_file(&csv);
    assert!(out.status.success(), "monitor: {}", text(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let drops = &summary["port_counters"]["eth0"]["rx_kernel_drops"];
    assert!(drops.as_u64() > Some(0), "{summary}");
    let warning = String::from_utf8_lossy(&out.stderr);
    assert!(
        warning.contains(&format!("eth0: the kernel dropped {drops} packets"))
            && warning.contains("--capture-buffer"),
        "{warning}"
    );
    assert!(summary["flows"]["records"].as_u64() > Some(0), "{summary}");
}

/// `io = "observe"` makes any program a passive monitor of a host's own interface: it sees
/// copies of both directions, the host's traffic goes on undisturbed, and what the program
/// forwards is never sent (here `forward` sends every packet back out of the same port:
/// with afpacket it does, with observe nothing leaves).
#[test]
fn observe_runs_a_program_as_a_monitor_that_sends_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up("line.toml", "tobserve");
    let ns = format!("sp-{}-h2", lab.name);
    let config = common::tmp("observe.toml");
    for io in ["observe", "afpacket"] {
        // A monitor's ring may be sized (a switch's may not).
        let ring = if io == "observe" {
            "capture_buffer = \"8M\"\n"
        } else {
            ""
        };
        std::fs::write(
            &config,
            format!(
                "io = \"{io}\"\n{ring}control = \"off\"\n[[port]]\nname = \"eth0\"\niface = \"eth0\"\n\
                 [program]\nname = \"forward\"\n[program.forward]\nmap = {{ eth0 = \"eth0\" }}\n"
            ),
        )
        .unwrap();
        let monitor = start_in(&ns, &["run", "--json", "-c"], &config);
        let out = lab.exec(
            "h1",
            &["ping", "-c", "5", "-i", "0.2", "-W", "2", "198.18.0.2"],
        );
        let run = interrupt(monitor);
        assert!(run.status.success(), "{io}: {}", text(&run));
        let summary: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
        let port = &summary["port_counters"]["eth0"];
        let (seen, sent) = (
            port["rx_packets"].as_u64().unwrap_or(0),
            port["tx_packets"].as_u64().unwrap_or(0),
        );
        if io == "observe" {
            assert!(seen >= 10, "copies of the pings both ways: {summary}");
            assert!(text(&out).contains("5 received"), "{}", text(&out));
            assert!(!text(&out).contains("DUP"), "{}", text(&out));
            assert_eq!(sent, 0, "a monitor sends nothing: {summary}");
            assert!(
                summary["counters"]["tx_packets"].as_u64().unwrap_or(0) >= 10,
                "forward's verdicts are still counted: {summary}"
            );
        } else {
            // afpacket takes what arrives (the requests) and sends it back out.
            assert!(seen >= 5, "{summary}");
            assert!(sent >= 5, "the same program on afpacket sends: {summary}");
        }
    }
    let _ = std::fs::remove_file(&config);
}

/// Values printed as `INDEX VALUE ...` (ctl sync read) or `NAME[INDEX] VALUE` (ctl
/// register), by index.
fn indexed_values(out: &Output) -> Vec<(u64, u64)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let first = words.next()?;
            let index = match first.split_once('[') {
                Some((_, rest)) => rest.trim_end_matches(']'),
                None => first,
            };
            Some((index.parse().ok()?, words.next()?.parse().ok()?))
        })
        .collect()
}

/// The line lab with `hh` on s1, its sketch synced to a collector at 198.19.255.1:7474
/// (the controller's address on the management network), refreshed every `refresh_ms`.
fn synced_hh_lab(name: &str, refresh_ms: u32) -> Lab {
    synced_lab(
        name,
        "hh",
        "tenants = 1\nwidth = 256\ndepth = 2\ninterval_ms = 3600000",
        "198.19.255.1:7474",
        refresh_ms,
    )
}

/// The line lab with `program` (configured by `settings`) on s1, its sketch synced to a
/// collector at `collector`, refreshed every `refresh_ms`.
fn synced_lab(name: &str, program: &str, settings: &str, collector: &str, refresh_ms: u32) -> Lab {
    Lab::up_edited("line.toml", name, None, |t| {
        t.replace(
            "[switch.program]\nname = \"forward\"",
            &format!(
                "[switch.program]\nname = \"{program}\"\n[switch.program.{program}]\n{settings}\n\
                 map = {{ p0 = \"p1\", p1 = \"p0\" }}\n\
                 [switch.guarantees]\nsketch = [\"synced\"]\n[switch.sync]\n\
                 collector = \"{collector}\"\nrefresh_ms = {refresh_ms}"
            ),
        )
    })
}

/// `stateplane collector` on lab host `host`, listening on `listen`, its API at
/// 127.0.0.1:9570 there (where [`ctl_sync`] and [`sketch_app_in`] look), its copy dumped
/// to `dump` at the end.
fn collector_in(
    lab: &Lab,
    host: &str,
    listen: &str,
    dump: &std::path::Path,
) -> std::process::Child {
    let args = [
        "collector",
        "--listen",
        listen,
        "--api",
        "127.0.0.1:9570",
        "--dump",
    ];
    start_in(&format!("sp-{}-{host}", lab.name), &args, dump)
}

/// Whether `ctl sync write`'s output says stream 0's write committed, with `then` in the
/// rest of its line (the write's id is any: a collector numbers its writes from a random
/// id).
fn committed_on_stream_0(out: &str, then: &str) -> bool {
    out.lines().any(|l| {
        l.strip_prefix("stream 0: write ")
            .and_then(|rest| rest.split_once(" committed"))
            .is_some_and(|(id, after)| id.parse::<u64>().is_ok() && after.contains(then))
    })
}

/// `stateplane ctl sync ARGS` on the controller, against the collector's API there.
fn ctl_sync(lab: &Lab, args: &[&str]) -> Output {
    let mut command = vec![
        env!("CARGO_BIN_EXE_stateplane"),
        "ctl",
        "-s",
        "127.0.0.1:9570",
        "sync",
    ];
    command.extend_from_slice(args);
    lab.exec("c1", &command)
}

/// A live `hh` switch syncs its sketch over the lab's management network to a
/// `stateplane collector` on the controller, while real traffic (ping) crosses it: once
/// the traffic stops, the collector's copy, read with `ctl sync read`, is the switch's own
/// register, read through its control API (`ctl register`), value for value and with
/// bound 0. A reset written through the collector (`ctl sync write --fill 0`) commits on
/// the switch, whose register then reads back zeros but for what crossed it since, and
/// the copy follows.
#[test]
fn a_live_switch_syncs_its_sketch_to_a_collector_on_the_controller() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = synced_hh_lab("tsync", 100);
    let dump = lab.file.with_extension("sync.csv");
    let collector = collector_in(&lab, "c1", "198.19.255.1:7474", &dump);
    let ping = lab.exec(
        "h1",
        &["ping", "-c", "300", "-i", "0.002", "-q", "198.18.0.2"],
    );
    assert!(text(&ping).contains("300 received"), "{}", text(&ping));
    // Once the traffic stops, the copy becomes the register: the last changes arrive
    // within a refresh pass (100 ms) of the switch's sync stage running, which a loaded
    // machine can delay, so the comparison is made again until it holds or 5 s pass.
    let copy_and_switch = || {
        let mut diff = Vec::new();
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(250));
            let copy = ctl_sync(&lab, &["read", "--stream", "0", "0..1024"]);
            assert!(copy.status.success(), "{}", text(&copy));
            assert!(
                String::from_utf8_lossy(&copy.stdout)
                    .lines()
                    .all(|l| l.ends_with(" ±0")),
                "every location exact: {}",
                text(&copy)
            );
            let own = ctl(&lab, &["register", "sketch", "0..1024"]);
            assert!(own.status.success(), "{}", text(&own));
            let (copy, own) = (indexed_values(&copy), indexed_values(&own));
            assert_eq!(copy.len(), 1024);
            if copy == own {
                return own;
            }
            diff = copy
                .iter()
                .zip(&own)
                .filter(|(a, b)| a != b)
                .map(|(a, b)| (a.0, a.1, b.1))
                .collect::<Vec<_>>();
        }
        panic!(
            "the collector's copy never became the switch's register: (index, copy, own) {diff:?}"
        );
    };
    let own = copy_and_switch();
    // Each packet adds 1 to a counter of each row: row 0 (sketch 0, the tenant's) counts
    // every packet forwarded, at least the 600 of the pings.
    let row0: u64 = own[..256].iter().map(|(_, v)| v).sum();
    let row1: u64 = own[256..512].iter().map(|(_, v)| v).sum();
    assert_eq!(row0, row1);
    assert!(row0 >= 600, "{row0}");

    let streams = ctl_sync(&lab, &["streams"]);
    assert!(
        text(&streams).contains("refused: none"),
        "{}",
        text(&streams)
    );

    let written = ctl_sync(&lab, &["write", "0..1024", "--fill", "0"]);
    assert!(
        committed_on_stream_0(&text(&written), ""),
        "{}",
        text(&written)
    );
    let own = copy_and_switch();
    let since: u64 = own[..256].iter().map(|(_, v)| v).sum();
    assert!(since < 50, "reset: only stray packets since ({since})");
    // Values wider than the sketch's 32-bit cells commit as refused, and the write says
    // so: an error naming how many, never "committed" alone.
    let wide = ctl_sync(&lab, &["write", "0..4", "--fill", "4294967296"]);
    assert!(!wide.status.success(), "{}", text(&wide));
    assert!(
        committed_on_stream_0(&text(&wide), ", 4 refused")
            && text(&wide).contains("refused 4 entries or values"),
        "{}",
        text(&wide)
    );

    let out = interrupt(collector);
    assert!(out.status.success(), "{}", text(&out));
    // The switch started before the collector: its first messages found no one (one gap
    // at the stream's start, which the refresh made good, as the reads above show).
    assert!(text(&out).contains("refused 0"), "{}", text(&out));
    let csv = std::fs::read_to_string(&dump).unwrap();
    assert!(csv.lines().count() > 1, "the dump holds the copy");

    // A collector that starts again numbers its writes afresh: the switch takes them up
    // from the new numbering, and a reset written through it lands (before 6e20b63 it was
    // answered "committed" and dropped, as a write of the old numbering already taken).
    let ping = lab.exec(
        "h1",
        &["ping", "-c", "100", "-i", "0.002", "-q", "198.18.0.2"],
    );
    assert!(text(&ping).contains("100 received"), "{}", text(&ping));
    let counted = || -> u64 {
        let own = ctl(&lab, &["register", "sketch", "0..256"]);
        assert!(own.status.success(), "{}", text(&own));
        indexed_values(&own).iter().map(|(_, v)| v).sum()
    };
    assert!(counted() >= 200, "the pings counted before the reset");
    let again = lab.file.with_extension("sync-again.csv");
    let collector = collector_in(&lab, "c1", "198.19.255.1:7474", &again);
    // Until the new collector's API listens and the switch's stream has reached it
    // (within a refresh): before then the write is refused ("has sent nothing yet"), or
    // cannot connect.
    let mut written = ctl_sync(&lab, &["write", "0..1024", "--fill", "0"]);
    for _ in 0..40 {
        if written.status.success() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        written = ctl_sync(&lab, &["write", "0..1024", "--fill", "0"]);
    }
    assert!(
        committed_on_stream_0(&text(&written), ""),
        "{}",
        text(&written)
    );
    let since = counted();
    assert!(
        since < 50,
        "the reset landed: only stray packets since ({since})"
    );
    let metrics = metric_lines(&lab, "s1");
    let renumbered = (metrics.lines())
        .find_map(|l| l.strip_prefix("stateplane_sync_writes_renumbered_total "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(renumbered >= Some(1), "{metrics}");
    // The commits were timed, and the pauses they and the passes made in forwarding.
    let seconds = |name: &str| {
        (metrics.lines())
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let committing = seconds("stateplane_sync_commit_seconds_total ");
    let longest_pause = seconds("stateplane_sync_longest_pause_seconds ");
    assert!(
        committing > Some(0.0) && longest_pause > Some(0.0),
        "{metrics}"
    );
    // The bounds the copy was given: counted over the messages of changes that carried them.
    let carried = seconds("stateplane_sync_threshold_messages_total ");
    let largest = seconds("stateplane_sync_largest_threshold ");
    assert!(carried > Some(0.0) && largest.is_some(), "{metrics}");
    let out = interrupt(collector);
    assert!(out.status.success(), "{}", text(&out));
}

/// The same over a sync channel that loses 30% of the datagrams each way, duplicates 5%
/// and reorders (`stateplane relay` on the controller, in front of the collector): every
/// value the collector calls bounded is within its bound of the switch's own, the loss
/// shows as missing messages, lost messages come again when asked for, and a write of
/// 1,024 values (3 parts) commits whole on the switch through it.
#[test]
fn a_lossy_sync_channel_never_gives_a_wrong_bound_and_writes_still_commit() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = synced_hh_lab("tlossy", 50);
    let dump = lab.file.with_extension("lossy.csv");
    let collector = collector_in(&lab, "c1", "127.0.0.1:7475", &dump);
    let relay = start_in(
        "sp-tlossy-c1",
        &[
            "relay",
            "--listen",
            "198.19.255.1:7474",
            "--to",
            "127.0.0.1:7475",
            "--loss",
            "0.3",
            "--duplicate",
            "0.05",
            "--delay-ms",
            "2",
            "--seed",
        ],
        std::path::Path::new("7"),
    );
    let ping = lab.exec(
        "h1",
        &["ping", "-c", "300", "-i", "0.002", "-q", "198.18.0.2"],
    );
    assert!(text(&ping).contains("300 received"), "{}", text(&ping));
    std::thread::sleep(Duration::from_millis(500));
    // Every bounded value is within its bound of the switch's own as of the copy's instant. The register is
    // read before and after the copy; a round counts only where it did not change between
    // (a stray packet, ARP, may cross the switch) and the copy is as of a moment between.
    let wall_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    };
    let check = || -> Option<(usize, u64)> {
        let since = wall_ns();
        let before = indexed_values(&ctl(&lab, &["register", "sketch", "0..1024"]));
        std::thread::sleep(Duration::from_millis(60));
        let copy = ctl_sync(&lab, &["read", "--stream", "0", "0..1024"]);
        assert!(copy.status.success(), "{}", text(&copy));
        let after = indexed_values(&ctl(&lab, &["register", "sketch", "0..1024"]));
        let as_of: u64 = String::from_utf8_lossy(&copy.stderr)
            .split_whitespace()
            .find_map(|w| w.parse().ok())
            .unwrap_or(0);
        if before != after || as_of < since {
            return None;
        }
        let own: std::collections::BTreeMap<u64, u64> = after.into_iter().collect();
        let mut bounded = 0;
        let mut largest = 0;
        for line in String::from_utf8_lossy(&copy.stdout).lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let (i, v): (u64, u64) = (words[0].parse().unwrap(), words[1].parse().unwrap());
            // A bound need not be 0: the loss reports lower the channel's capacity, and
            // with it the threshold may rise.
            match words[2].strip_prefix('±') {
                Some(bound) => {
                    let bound: u64 = bound.parse().unwrap();
                    let own = own[&i];
                    assert!(own.abs_diff(v) <= bound, "location {i} is {own}: {line}");
                    bounded += 1;
                    largest = largest.max(bound);
                }
                None => assert_eq!(words[2], "unbounded", "{line}"),
            }
        }
        Some((bounded, largest))
    };
    let mut compared = 0;
    let mut bounded = 0;
    for _ in 0..20 {
        if let Some((b, _)) = check() {
            compared += 1;
            bounded = bounded.max(b);
        }
    }
    assert!(
        compared > 0 && bounded > 0,
        "{compared} rounds compared, {bounded} bounded"
    );

    // The sketch's largest value takes 4 bytes: 345 to a part on the 1,500-byte path,
    // three parts (a fill of 0 would go as one run of 1-byte values, in one part). Its
    // counters stop there, so the whole register must read it after the commit.
    let written = ctl_sync(
        &lab,
        &[
            "write",
            "0..1024",
            "--fill",
            "4294967295",
            "--timeout-ms",
            "5000",
        ],
    );
    assert!(
        committed_on_stream_0(&text(&written), ", 3 parts"),
        "{}",
        text(&written)
    );
    let own = indexed_values(&ctl(&lab, &["register", "sketch", "0..1024"]));
    let other: Vec<_> = own
        .iter()
        .filter(|&&(_, v)| v != u64::from(u32::MAX))
        .collect();
    assert!(
        own.len() == 1024 && other.is_empty(),
        "the write committed whole: {} values, these not written: {other:?}",
        own.len()
    );
    // The write's changes go back as a write's, at once and each costing the rate
    // controller one update: they do not raise the threshold by the size of 2^32 - 1
    // (they raised it to about 2^39 when they counted as the data plane's changes).
    for _ in 0..5 {
        if let Some((_, largest)) = check() {
            assert!(largest < 1 << 20, "largest bound {largest}");
        }
    }

    let streams = ctl_sync(&lab, &["streams"]);
    let missing: u64 = String::from_utf8_lossy(&streams.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().nth(5))
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    assert!(missing > 0, "the loss shows: {}", text(&streams));
    let relayed = interrupt(relay);
    assert!(
        text(&relayed).contains("to the target: received"),
        "{}",
        text(&relayed)
    );
    let out = interrupt(collector);
    assert!(out.status.success(), "{}", text(&out));
    // The collector asked for lost messages, and some came again through the loss (the
    // checks above held with them taken).
    let summary = text(&out);
    let repaired: u64 = summary
        .split(" sent again")
        .next()
        .and_then(|before| before.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(repaired > 0, "{summary}");
}

/// The line lab with `program` (`settings`) on s1, its sketch synced every 50 ms to a
/// `stateplane collector` on s1 itself, whose API (127.0.0.1:9570) is then on the same
/// loopback as the switch's control API: what the sketch applications talk to.
fn synced_beside_collector(
    name: &str,
    program: &str,
    settings: &str,
) -> (Lab, std::process::Child) {
    let lab = synced_lab(name, program, settings, "127.0.0.1:7474", 50);
    let collector = collector_in(
        &lab,
        "s1",
        "127.0.0.1:7474",
        &lab.file.with_extension("sync.csv"),
    );
    (lab, collector)
}

/// `count` pings from h1 to h2, 2 ms apart, all of them answered, with one identifier:
/// the same two flows (request and reply) each time.
fn ping_as_one_flow(lab: &Lab, count: &str) {
    let out = lab.exec(
        "h1",
        &[
            "ping",
            "-e",
            "4242",
            "-c",
            count,
            "-i",
            "0.002",
            "-q",
            "198.18.0.2",
        ],
    );
    assert!(
        text(&out).contains(&format!("{count} received")),
        "{}",
        text(&out)
    );
}

/// The flows of [`ping_as_one_flow`], as an `hh` switch (reporting at 100 packets) names
/// them in its own reports: request and reply.
fn pings_flows(lab: &Lab) -> Vec<String> {
    ping_as_one_flow(lab, "200");
    let reports = ctl(lab, &["read", "heavy_hitters"]);
    let keys: Vec<String> = String::from_utf8_lossy(&reports.stdout)
        .lines()
        .filter_map(|l| l.split(" found ").next().map(str::to_string))
        .collect();
    assert_eq!(keys.len(), 2, "request and reply: {}", text(&reports));
    keys
}

/// The heavy-hitter application (`ctl sync hh`) beside a live `hh` switch, on a collector
/// on the switch's host: the flows of real traffic (ping's request and reply), which the
/// application learns from the switch's `heavy_hitters` as its data plane files them while
/// the application runs, are found heavy in the interval they cross the switch, each with
/// its exact count, and in no other; a flow given with `--keys` that never crossed is never
/// found.
#[test]
fn heavy_hitters_are_found_per_interval_from_the_collectors_copy() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let settings = "tenants = 1\nwidth = 256\ndepth = 2\ninterval_ms = 3600000\nthreshold = 100";
    let (lab, collector) = synced_beside_collector("thh", "hh", settings);
    let ping = |count: &str| ping_as_one_flow(&lab, count);
    let keys = pings_flows(&lab);
    let mut asked = vec!["counters-of", "heavy_hitters"];
    asked.extend(keys[0].split_whitespace());
    let at = ctl(&lab, &asked);
    let cells: Vec<u32> = String::from_utf8_lossy(&at.stdout)
        .trim()
        .strip_prefix("worker 0: ")
        .map(|c| c.split(' ').filter_map(|i| i.parse().ok()).collect())
        .unwrap_or_default();
    assert!(
        cells.len() == 2 && cells[0] < 256 && (256..512).contains(&cells[1]),
        "a counter in each row of the one tenant's sketch: {}",
        text(&at)
    );
    // The switch forgets the flows it found: the application learns them as they come.
    for key in &keys {
        let mut delete = vec!["delete", "heavy_hitters"];
        delete.extend(key.split_whitespace());
        let deleted = ctl(&lab, &delete);
        assert!(deleted.status.success(), "{}", text(&deleted));
    }
    let left = ctl(&lab, &["read", "heavy_hitters"]);
    assert_eq!(
        String::from_utf8_lossy(&left.stdout).trim(),
        "",
        "{}",
        text(&left)
    );
    let never = "src=198.18.0.1 dst=198.18.0.2 proto=17 src_port=9 dst_port=9 vlan=0";
    let key_file = lab.file.with_extension("keys");
    std::fs::write(&key_file, format!("{never}\n# a comment\n")).unwrap();
    let app = sketch_app_in(
        &lab,
        &[
            "hh",
            "--keys",
            &key_file.to_string_lossy(),
            "--threshold",
            "300",
            "--interval-ms",
            "2000",
            "--intervals",
            "2",
        ],
    );
    let ended = once_watching(app);
    ping("400");
    let out = ended();
    assert!(out.status.success(), "{}", text(&out));
    let found = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("watching 1 keys and each the switch files in heavy_hitters"),
        "{err}"
    );
    for key in &keys {
        let line = format!("interval 1: {key} estimate 400 (400..400) sure");
        assert!(found.contains(&line), "{line} in: {}", text(&out));
    }
    assert_eq!(
        found.lines().count(),
        2,
        "nothing else, never the light flow: {found}"
    );
    assert!(
        err.contains("interval 1: 2 of 3 keys found; 1024 counters read (0 unbounded)"),
        "{err}"
    );
    assert!(err.contains("interval 2: 0 of 3 keys found"), "{err}");
    let out = interrupt(collector);
    assert!(out.status.success(), "{}", text(&out));
}

/// A sketch application outlives its collector going away and coming back: the intervals
/// while it is gone fail, each said on stderr with why, the first after its return starts
/// the counting afresh, and the traffic that crosses the switch from then on is counted
/// whole, packet for packet, over the intervals that follow. With the collector gone for
/// good, it gives up after `--give-up-after` intervals, and says so.
#[test]
fn a_sketch_application_outlives_its_collector_going_and_coming_back() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let settings = "tenants = 1\nwidth = 256\ndepth = 2\ninterval_ms = 3600000\nthreshold = 100";
    let (lab, collector) = synced_beside_collector("tsap", "hh", settings);
    let keys = pings_flows(&lab);
    let key_file = lab.file.with_extension("keys");
    std::fs::write(&key_file, keys.join("\n") + "\n").unwrap();
    let key_file = key_file.to_string_lossy();
    // Every interval's count of each key printed (threshold 1).
    let hh = |more: &[&str]| {
        let mut args = vec!["hh", "--keys", &key_file, "--threshold", "1"];
        args.extend_from_slice(more);
        sketch_app_in(&lab, &args)
    };
    let app = hh(&["--interval-ms", "500", "--intervals", "16"]);
    let ended = once_watching(app);
    let out = interrupt(collector);
    assert!(out.status.success(), "{}", text(&out));
    std::thread::sleep(Duration::from_millis(1200));
    let collector = collector_in(
        &lab,
        "s1",
        "127.0.0.1:7474",
        &lab.file.with_extension("sync2.csv"),
    );
    // The application's next try finds the collector back and starts afresh.
    std::thread::sleep(Duration::from_millis(1000));
    ping_as_one_flow(&lab, "400");
    let out = ended();
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("failed, nothing found in it"), "{err}");
    let restarted = (err.lines())
        .filter_map(|l| l.strip_suffix(": started again: counting afresh from now"))
        .filter_map(|l| l.strip_prefix("interval ")?.parse::<u32>().ok())
        .next_back()
        .unwrap_or_else(|| panic!("started again: {err}"));
    // The request's flow after the restart, interval by interval: each interval takes
    // away what it read, so what it read over them all is what the switch counted, once
    // the copy is exact again after the traffic (the last intervals, with nothing to
    // read), however the threshold moved the bounds in between.
    let counted: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&keys[0]))
        .filter(|l| {
            let number = l
                .strip_prefix("interval ")
                .and_then(|l| l.split(':').next());
            number.and_then(|n| n.parse::<u32>().ok()) > Some(restarted)
        })
        .map(|l| {
            let estimate = l.split(" estimate ").nth(1).unwrap_or_default();
            let mut words = estimate.split(' ');
            let value: u64 = words.next().unwrap_or_default().parse().unwrap();
            let range = words.next().unwrap_or_default();
            let (low, high) = (range.trim_matches(['(', ')']).split_once(".."))
                .unwrap_or_else(|| panic!("a range: {l}"));
            let high = if high == "unbounded" {
                u64::MAX
            } else {
                high.parse().unwrap()
            };
            let low: u64 = low.parse().unwrap();
            assert!(low <= value && value <= high, "{l}");
            value
        })
        .sum();
    assert_eq!(counted, 400, "{}", text(&out));

    // Gone for good while an application watches: it gives up, and says why.
    let ended = once_watching(hh(&["--interval-ms", "100", "--give-up-after", "3"]));
    let out = interrupt(collector);
    assert!(out.status.success(), "{}", text(&out));
    let out = ended();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("gave up after 3 failed intervals in a row (--give-up-after)"),
        "{}",
        text(&out)
    );
    let out = hh(&["--interval-ms", "100"]).wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("cannot reach the collector's API"),
        "a collector gone before the start is an error at once: {}",
        text(&out)
    );
}

/// UDP flood prevention (`ctl sync udpflood`) beside a live `udpflood` switch that never
/// detects by itself (its threshold is out of reach): a flood of real datagrams at h2 is
/// found from the collector's copy in the interval it comes, pushed into the switch's
/// `victims`, and the switch then drops the flood's datagrams while ping still passes.
#[test]
fn a_udp_flood_is_found_from_the_copy_and_mitigated_by_the_switch() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let settings = "threshold = 4000000000\nwidth = 1024\ndepth = 3\ninterval_ms = 3600000";
    let (lab, collector) = synced_beside_collector("tufp", "udpflood", settings);
    let ping = lab.exec("h1", &["ping", "-c", "3", "-i", "0.2", "-q", "198.18.0.2"]);
    assert!(text(&ping).contains("3 received"), "{}", text(&ping));
    let flood = |count: u32| {
        // In bursts of 100 with a pause: a burst of 1,000 at once can overflow the
        // kernel's backlog on the way into the switch (1,000 packets by default), and
        // the test counts every datagram.
        let script = format!(
            "for i in $(seq {count}); do echo x > /dev/udp/198.18.0.2/9; \
             [ $((i % 100)) -eq 0 ] && sleep 0.01; done; true"
        );
        let out = lab.exec("h1", &["bash", "-c", &script]);
        assert!(out.status.success(), "{}", text(&out));
    };
    let app = sketch_app_in(
        &lab,
        &[
            "udpflood",
            "--protect",
            "198.18.0.0/30",
            "--threshold",
            "500",
            "--interval-ms",
            "2000",
            "--intervals",
            "2",
        ],
    );
    let ended = once_watching(app);
    flood(1000);
    let out = ended();
    assert!(out.status.success(), "{}", text(&out));
    let found = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        found.contains("interval 1: dst=198.18.0.2 estimate 1000 (1000..1000) sure, pushed"),
        "{}",
        text(&out)
    );
    assert_eq!(found.lines().count(), 1, "{found}");
    let victims = ctl(&lab, &["read", "victims"]);
    assert!(
        text(&victims).contains("dst=198.18.0.2 found interval=1 packets=1000"),
        "{}",
        text(&victims)
    );
    let dropped = || -> u64 {
        let stats = ctl(&lab, &["stats"]);
        String::from_utf8_lossy(&stats.stdout)
            .lines()
            .find(|l| l.starts_with("pipeline.dropped "))
            .and_then(|l| l.split_whitespace().last()?.parse().ok())
            .unwrap_or_else(|| panic!("no drops counted: {}", text(&stats)))
    };
    let before = dropped();
    flood(300);
    let ping = lab.exec("h1", &["ping", "-c", "3", "-i", "0.2", "-q", "198.18.0.2"]);
    assert!(
        text(&ping).contains("3 received"),
        "ping passes: {}",
        text(&ping)
    );
    assert_eq!(
        dropped() - before,
        300,
        "every flood datagram to the victim dropped"
    );
    let out = interrupt(collector);
    assert!(out.status.success(), "{}", text(&out));
}

/// The `stateplane ctl` examples of docs/cli.md run as written, each against a live switch
/// running the program whose state it names (`macs`: l2, `routes4`: router, `rules` and
/// its registers and meters: acl, `connections`: conntrack, the flow verbs: a two-table
/// pipeline; the rest: l2, as the first example block's), with the files they read
/// (`entries.txt`, `rules.txt`) in the switch's run directory: every one succeeds.
#[test]
fn the_ctl_examples_of_the_docs_run_as_written() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let doc = std::fs::read_to_string(topologies().join("../docs/cli.md")).unwrap();
    let section = doc
        .split("\n## `stateplane ctl")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap();
    // Each example, its continuation lines joined, its comment and optional parts cut.
    let mut examples: Vec<String> = Vec::new();
    let mut continued = false;
    for line in section.lines() {
        let Some(code) = line.strip_prefix("    ") else {
            continue;
        };
        let code = code.split("  #").next().unwrap_or(code).trim_end();
        if continued {
            let last = examples.last_mut().unwrap();
            last.push(' ');
            last.push_str(code.trim_start());
        } else if code.starts_with("stateplane ctl ") {
            examples.push(code.to_owned());
        }
        continued = code.ends_with('\\');
        if continued {
            examples.last_mut().unwrap().pop();
        }
    }
    let program = |example: &str| {
        let words: Vec<&str> = example.split_whitespace().collect();
        let has = |w: &str| words.contains(&w);
        if has("routes4") {
            "router"
        } else if has("rules") || has("rule_packets") || has("rule_meters") {
            "acl"
        } else if has("connections") {
            "conntrack"
        } else if words
            .iter()
            .any(|w| w.ends_with("-flow") || w.ends_with("-flows"))
        {
            "pipeline"
        } else {
            "l2"
        }
    };
    let mut programs: Vec<&str> = examples.iter().map(|e| program(e)).collect();
    programs.dedup();
    assert!(examples.len() >= 20 && programs.len() >= 5, "{examples:#?}");
    programs.sort_unstable();
    programs.dedup();
    for name in programs {
        let settings = match name {
            "pipeline" => {
                "[switch.program.pipeline]\ntables = 2\nrules = [\"table=0,priority=1,actions=goto_table:1\", \"table=1,priority=1,actions=output:1\"]\n"
            }
            _ => "",
        };
        let lab = Lab::up_edited("line-l2.toml", &format!("tdoc{}", &name[..2]), None, |t| {
            let (head, rest) = t.split_once("[switch.program]").unwrap();
            let (_, links) = rest.split_once("[[link]]").unwrap();
            format!("{head}[switch.program]\nname = \"{name}\"\n{settings}\n[[link]]{links}")
        });
        let dir = run_dir_of(&format!("sp-{}-s1", lab.name));
        std::fs::write(
            dir.join("entries.txt"),
            "vlan=0 mac=02:00:00:00:01:03 forward port=1\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("rules.txt"),
            "table=1,priority=5,cookie=0x15,ip,actions=output:1\n",
        )
        .unwrap();
        for example in examples.iter().filter(|e| program(e) == name) {
            let command = example.replacen("stateplane", env!("CARGO_BIN_EXE_stateplane"), 1);
            let shell = format!("cd {} && {command}", dir.display());
            let out = lab.exec("s1", &["sh", "-c", &shell]);
            assert!(out.status.success(), "{name}: {example}:\n{}", text(&out));
        }
        if name == "acl" {
            // A meter given the wrong count of numbers is refused, not read instead.
            for (marker, given, want) in [
                ("--trtcm", "1,2,3", "--trtcm takes four numbers"),
                ("--srtcm", "1,2", "--srtcm takes three numbers"),
            ] {
                let out = ctl(&lab, &["meter", "rule_meters", "0", marker, given]);
                assert!(!out.status.success(), "{marker} {given}: {}", text(&out));
                assert!(
                    text(&out).contains(want),
                    "{marker} {given}: {}",
                    text(&out)
                );
            }
        }
    }
}

/// The collector examples of docs/cli.md (`ctl -s 127.0.0.1:9570 sync streams`, `read`,
/// `write`, `watch`) run as written on the controller, against a collector holding the
/// copy of a live `hh` switch's synced sketch while traffic crosses it: every one
/// succeeds. The sketch applications' (`sync hh`, `sync udpflood`), which run until
/// interrupted, start as written beside the switch of their program (they reach its
/// control socket) and watch, still running a second later. (`sync migrate` needs two
/// switches: `crates/cli/tests/sync.rs` moves state with it.)
#[test]
fn the_sync_examples_of_the_docs_run_as_written() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let doc = std::fs::read_to_string(topologies().join("../docs/cli.md")).unwrap();
    let examples: Vec<&str> = (doc.lines())
        .filter_map(|l| l.strip_prefix("    stateplane ctl -s 127.0.0.1:9570 sync "))
        .map(|l| l.split("  #").next().unwrap_or(l).trim_end())
        .filter(|l| {
            ["streams", "read", "write", "watch"]
                .iter()
                .any(|v| l.starts_with(v))
        })
        .collect();
    assert!(examples.len() >= 8, "{examples:?}");
    let lab = synced_hh_lab("tdocsync", 100);
    let dump = lab.file.with_extension("sync.csv");
    let mut collector = collector_in(&lab, "c1", "198.19.255.1:7474", &dump);
    // Traffic while the examples run, so that `watch` sees changes.
    let mut ping = Command::new("ip")
        .args(["netns", "exec", &format!("sp-{}-h1", lab.name)])
        .args(["ping", "-c", "1500", "-i", "0.01", "-q", "198.18.0.2"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    for example in examples {
        let command = format!(
            "{} ctl -s 127.0.0.1:9570 sync {example}",
            env!("CARGO_BIN_EXE_stateplane")
        );
        let out = lab.exec("c1", &["timeout", "20", "sh", "-c", &command]);
        assert!(out.status.success(), "{example}:\n{}", text(&out));
    }
    let _ = ping.kill();
    let _ = ping.wait();
    let _ = collector.kill();
    let _ = collector.wait();
    drop(lab);
    let apps: Vec<Vec<&str>> = (doc.lines())
        .filter_map(|l| l.strip_prefix("    stateplane ctl -s 127.0.0.1:9570 sync "))
        .filter(|l| l.starts_with("hh ") || l.starts_with("udpflood "))
        .map(|l| {
            l.split("  #")
                .next()
                .unwrap_or(l)
                .split_whitespace()
                .collect()
        })
        .collect();
    assert_eq!(apps.len(), 2, "{apps:?}");
    for app in apps {
        let settings = match app[0] {
            "hh" => "tenants = 1\nwidth = 256\ndepth = 2\ninterval_ms = 3600000",
            _ => "threshold = 4000000000\nwidth = 1024\ndepth = 3\ninterval_ms = 3600000",
        };
        let (lab, mut collector) =
            synced_beside_collector(&format!("tdoc{}", &app[0][..2]), app[0], settings);
        let started = once_watching(sketch_app_in(&lab, &app));
        std::thread::sleep(Duration::from_secs(1));
        let running = Command::new("pkill")
            .args(["-INT", "-f", &format!("sync {}", app.join(" "))])
            .status()
            .unwrap();
        assert!(
            running.success(),
            "{app:?} was still running a second later"
        );
        let out = started();
        assert!(
            !text(&out).contains("error"),
            "{app:?} ended on an error: {}",
            text(&out)
        );
        let _ = collector.kill();
        let _ = collector.wait();
    }
}
