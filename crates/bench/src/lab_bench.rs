//! `stateplane lab bench`: the live-port benchmark on the `line` topology (h1 - s1 - h2).
//!
//! For each way of switching between the same two veths in s1 (a Linux bridge, with the
//! veths' offloads on or off; the kernel routing; stateplane `forward` over AF_PACKET, over
//! AF_XDP) it measures, in one run, interleaved and repeated:
//! packets per second delivered to h2 from a small-packet flood sent from h1, TCP
//! throughput with iperf3, CPU seconds per million packets (the whole machine's busy
//! time, and the switch process's own), TCP retransmissions, and the round trip of pings
//! at a low rate.

use crate::BenchResult;
use crate::results::{Csv, ResultFiles, Table};
use crate::statistics::{median, percentile};
use stateplane_lab::Topology;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct LabBenchArgs {
    /// Ways of switching to compare: bridge (the kernel's, offloads off as in every mode),
    /// bridge-offloads (the same with the hosts' and veths' offloads on: TSO, GSO, GRO,
    /// checksums), routing (the kernel's IP forwarding), afpacket, afxdp (stateplane),
    /// afpacket-offloads, afxdp-offloads (stateplane with the offloads on as
    /// bridge-offloads has them).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bridge,bridge-offloads,routing,afpacket,afxdp,afpacket-offloads,afxdp-offloads"
    )]
    pub modes: Vec<String>,
    /// Seconds of each flood and of each iperf3 run.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Rounds (all modes in turn each round); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Bytes per frame of the flood.
    #[arg(long, default_value_t = 64)]
    pub packet_size: usize,
    #[command(flatten)]
    pub files: ResultFiles,
    /// Print the results as JSON (for scripts) instead of a table.
    #[arg(long)]
    pub json: bool,
}

const TOPOLOGY: &str = include_str!("../../../topologies/line.toml");

pub(crate) fn sh(program: &str, args: &[&str]) -> BenchResult<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("running {program}: {e} (is it installed?)"))?;
    if !out.status.success() {
        return Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Busy and total CPU time of the whole machine, in clock ticks (/proc/stat).
fn machine_busy_ticks() -> BenchResult<u64> {
    let stat = std::fs::read_to_string("/proc/stat").map_err(|e| e.to_string())?;
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Ok(total - idle)
}

/// CPU time of a process (user + system), in clock ticks; 0 if it is gone.
fn process_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            // Fields after the command: state is 3rd overall, utime 14th, stime 15th.
            Some(rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0)
}

pub(crate) fn rx_packets(t: &Topology, node: &str, iface: &str) -> BenchResult<u64> {
    let out = sh(
        "ip",
        &[
            "netns",
            "exec",
            &t.namespace(node),
            "cat",
            &format!("/sys/class/net/{iface}/statistics/rx_packets"),
        ],
    )?;
    out.trim().parse().map_err(|e| format!("rx_packets: {e}"))
}

/// The modes `--modes` takes.
const MODES: [&str; 7] = [
    "bridge",
    "bridge-offloads",
    "routing",
    "afpacket",
    "afxdp",
    "afpacket-offloads",
    "afxdp-offloads",
];

#[derive(Clone, Debug, Default)]
struct Sample {
    mpps: f64,
    sent_mpps: f64,
    gbps: f64,
    /// Segments iperf3's sender sent again.
    retransmits: f64,
    machine_cpu_s_per_mpkt: f64,
    /// The switching process's own CPU; `None` for the bridge, which is the kernel's
    /// (its share is in the machine's, spread over softirqs with the veths').
    switch_cpu_s_per_mpkt: Option<f64>,
    /// Round trips of [`PINGS`] pings from h1 to h2 at 100 a second, on an idle path.
    ping_median_us: f64,
    ping_p99_us: f64,
}

/// Pings per measurement, 10 ms apart (`ping -c 200 -i 0.01`).
const PINGS: usize = 200;

/// The round trips of `PINGS` pings from h1 to h2 in microseconds: median and 99th
/// percentile. Every ping must be answered: a lost one would hide a stall.
fn ping_round_trips(t: &Topology) -> BenchResult<(f64, f64)> {
    let count = PINGS.to_string();
    let out = sh(
        "ip",
        &[
            "netns",
            "exec",
            &t.namespace("h1"),
            "ping",
            "-n",
            "-c",
            &count,
            "-i",
            "0.01",
            "-W",
            "1",
            "198.18.0.2",
        ],
    )?;
    let mut micros = round_trips_us(&out);
    if micros.len() != PINGS {
        return Err(format!(
            "ping: {} of {PINGS} answered:\n{out}",
            micros.len()
        ));
    }
    let median_us = percentile(&mut micros, 0.5);
    let p99_us = percentile(&mut micros, 0.99);
    Ok((median_us as f64, p99_us as f64))
}

/// The round trips `ping` printed (`time=0.045 ms`), in whole microseconds.
fn round_trips_us(ping_output: &str) -> Vec<u64> {
    (ping_output.lines())
        .filter_map(|l| {
            l.split_once("time=")?
                .1
                .strip_suffix(" ms")?
                .parse::<f64>()
                .ok()
        })
        .map(|ms| (ms * 1000.0).round() as u64)
        .collect()
}

/// The switching between p0 and p1 in s1, set up and torn down.
enum Switching {
    /// With the offloads on, or off as the lab has them.
    Bridge { offloads: bool },
    /// s1 forwards IP between p0 (toward h1) and p1 (toward h2), whose MAC h1 sends to.
    Routing { p0_mac: String },
    /// A stateplane switch (its process id), the offloads on or off.
    Stateplane { pid: u32, offloads: bool },
}

/// The hosts' and s1's ends of the two links.
const LINK_ENDS: [(&str, &str); 4] = [("h1", "eth0"), ("s1", "p0"), ("s1", "p1"), ("h2", "eth0")];

/// Turns the offloads the lab turns off on every end of both links on or off.
fn set_offloads(t: &Topology, on: bool) -> BenchResult<()> {
    let state = if on { "on" } else { "off" };
    for (node, iface) in LINK_ENDS {
        let ns = t.namespace(node);
        let mut args = vec!["netns", "exec", &ns, "ethtool", "-K", iface];
        for feature in ["tx", "tso", "gso", "gro"] {
            args.extend([feature, state]);
        }
        sh("ip", &args)?;
    }
    Ok(())
}

/// Kernel routing in s1 between h1 (198.18.0.1, behind p0) and h2 (198.18.0.2, behind p1),
/// which share a /24: static neighbours make each host send the other's packets to s1, and
/// a routing table of their own sends all that comes in on p0 (the flood's many
/// addresses, IPv6 too, some of them the management network's) on to h2.
fn start_routing(t: &Topology) -> BenchResult<Switching> {
    let s1 = t.namespace("s1");
    let mac = |node: &str, iface: &str| -> BenchResult<String> {
        let path = format!("/sys/class/net/{iface}/address");
        Ok(
            sh("ip", &["netns", "exec", &t.namespace(node), "cat", &path])?
                .trim()
                .to_owned(),
        )
    };
    let (p0_mac, p1_mac) = (mac("s1", "p0")?, mac("s1", "p1")?);
    let (h1_mac, h2_mac) = (mac("h1", "eth0")?, mac("h2", "eth0")?);
    for setting in FORWARDING {
        let on = format!("{setting}=1");
        sh("ip", &["netns", "exec", &s1, "sysctl", "-q", "-w", &on])?;
    }
    // The lab turns IPv6 off (no router solicitations in the captures); a router of the
    // flood's IPv6 packets needs it on its ports.
    for setting in [
        "net.ipv4.conf.all.rp_filter=0",
        "net.ipv4.conf.p0.rp_filter=0",
        "net.ipv6.conf.p0.disable_ipv6=0",
        "net.ipv6.conf.p1.disable_ipv6=0",
    ] {
        sh("ip", &["netns", "exec", &s1, "sysctl", "-q", "-w", setting])?;
    }
    let steps: [(&str, Vec<&str>); 11] = [
        (&s1, vec!["route", "add", "198.18.0.1/32", "dev", "p0"]),
        (&s1, vec!["route", "add", "198.18.0.2/32", "dev", "p1"]),
        (&s1, vec!["rule", "add", "iif", "p0", "table", ROUTES]),
        (
            &s1,
            vec![
                "route",
                "add",
                "default",
                "via",
                "198.18.0.2",
                "dev",
                "p1",
                "table",
                ROUTES,
            ],
        ),
        (&s1, vec!["-6", "rule", "add", "iif", "p0", "table", ROUTES]),
        (
            &s1,
            vec![
                "-6", "neigh", "replace", "fe80::2", "lladdr", &h2_mac, "dev", "p1",
            ],
        ),
        (
            &s1,
            vec![
                "-6", "route", "add", "default", "via", "fe80::2", "dev", "p1", "table", ROUTES,
            ],
        ),
        (
            &s1,
            vec![
                "neigh",
                "replace",
                "198.18.0.1",
                "lladdr",
                &h1_mac,
                "dev",
                "p0",
            ],
        ),
        (
            &s1,
            vec![
                "neigh",
                "replace",
                "198.18.0.2",
                "lladdr",
                &h2_mac,
                "dev",
                "p1",
            ],
        ),
        (
            &t.namespace("h1"),
            vec![
                "neigh",
                "replace",
                "198.18.0.2",
                "lladdr",
                &p0_mac,
                "dev",
                "eth0",
            ],
        ),
        (
            &t.namespace("h2"),
            vec![
                "neigh",
                "replace",
                "198.18.0.1",
                "lladdr",
                &p1_mac,
                "dev",
                "eth0",
            ],
        ),
    ];
    for (ns, args) in steps {
        let mut all = vec!["-n", ns];
        all.extend(args);
        sh("ip", &all)?;
    }
    Ok(Switching::Routing { p0_mac })
}

/// The routing table of what s1 routes from p0.
const ROUTES: &str = "100";
/// What makes s1 a router.
const FORWARDING: [&str; 2] = ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"];

/// Undoes [`start_routing`]: the hosts learn each other's address again by ARP.
fn stop_routing(t: &Topology) -> BenchResult<()> {
    let s1 = t.namespace("s1");
    for (ns, args) in [
        (
            &s1,
            ["rule", "del", "iif", "p0", "table", ROUTES].as_slice(),
        ),
        (&s1, &["-6", "rule", "del", "iif", "p0", "table", ROUTES]),
        (&s1, &["route", "flush", "table", ROUTES]),
        (&s1, &["-6", "route", "flush", "table", ROUTES]),
        (&s1, &["-6", "neigh", "del", "fe80::2", "dev", "p1"]),
        (&s1, &["route", "del", "198.18.0.1/32"]),
        (&s1, &["route", "del", "198.18.0.2/32"]),
        // `neigh flush` would leave these: they are permanent.
        (&s1, &["neigh", "del", "198.18.0.1", "dev", "p0"]),
        (&s1, &["neigh", "del", "198.18.0.2", "dev", "p1"]),
        (
            &t.namespace("h1"),
            &["neigh", "del", "198.18.0.2", "dev", "eth0"],
        ),
        (
            &t.namespace("h2"),
            &["neigh", "del", "198.18.0.1", "dev", "eth0"],
        ),
    ] {
        let mut all = vec!["-n", ns];
        all.extend(args);
        sh("ip", &all)?;
    }
    for setting in FORWARDING {
        let off = format!("{setting}=0");
        sh("ip", &["netns", "exec", &s1, "sysctl", "-q", "-w", &off])?;
    }
    for setting in [
        "net.ipv6.conf.p0.disable_ipv6=1",
        "net.ipv6.conf.p1.disable_ipv6=1",
    ] {
        sh("ip", &["netns", "exec", &s1, "sysctl", "-q", "-w", setting])?;
    }
    Ok(())
}

fn start(t: &Topology, mode: &str, exe: &Path) -> BenchResult<Switching> {
    let ns = t.namespace("s1");
    if mode == "routing" {
        return start_routing(t);
    }
    if let Some(offloads) = match mode {
        "bridge" => Some(false),
        "bridge-offloads" => Some(true),
        _ => None,
    } {
        if offloads {
            set_offloads(t, true)?;
        }
        sh("ip", &["-n", &ns, "link", "add", "br0", "type", "bridge"])?;
        for p in ["p0", "p1"] {
            sh("ip", &["-n", &ns, "link", "set", p, "master", "br0"])?;
        }
        sh("ip", &["-n", &ns, "link", "set", "br0", "up"])?;
        // Forward at once: no learning delay, no spanning tree.
        sh(
            "ip",
            &[
                "-n",
                &ns,
                "link",
                "set",
                "br0",
                "type",
                "bridge",
                "forward_delay",
                "0",
            ],
        )?;
        return Ok(Switching::Bridge { offloads });
    }
    let (io, offloads) = match mode.strip_suffix("-offloads") {
        Some(io) => (io, true),
        None => (mode, false),
    };
    if offloads {
        set_offloads(t, true)?;
    }
    let mut s = t.switch[0].clone();
    s.io = Some(io.to_owned());
    let pid = stateplane_lab::start_switch(t, &s, exe)?;
    Ok(Switching::Stateplane { pid, offloads })
}

fn stop(t: &Topology, s: &Switching) -> BenchResult<()> {
    match s {
        Switching::Bridge { offloads } => {
            sh("ip", &["-n", &t.namespace("s1"), "link", "del", "br0"])?;
            if *offloads {
                set_offloads(t, false)?;
            }
        }
        Switching::Routing { .. } => stop_routing(t)?,
        Switching::Stateplane { offloads, .. } => {
            stateplane_lab::stop_switch(t, "s1")?;
            if *offloads {
                set_offloads(t, false)?;
            }
        }
    }
    Ok(())
}

fn measure(
    t: &Topology,
    s: &Switching,
    a: &LabBenchArgs,
    exe: &Path,
    trace: &Path,
    hz: f64,
) -> BenchResult<Sample> {
    let pid = match s {
        Switching::Stateplane { pid, .. } => Some(*pid),
        _ => None,
    };
    // The flood goes to h2 by MAC, so that a learning bridge forwards every frame; a
    // router takes it at its own.
    let dst_mac = match s {
        Switching::Routing { p0_mac } => p0_mac.as_str(),
        _ => "02:00:00:00:01:02",
    };
    // Latency first, on the idle path (the first ping also teaches h1 h2's address).
    let (ping_median_us, ping_p99_us) = ping_round_trips(t)?;
    // Small-packet flood from h1; delivered = what h2's interface received.
    let rx0 = rx_packets(t, "h2", "eth0")?;
    let (busy0, proc0) = (machine_busy_ticks()?, pid.map_or(0, process_ticks));
    let started = Instant::now();
    let out = sh(
        "ip",
        &[
            "netns",
            "exec",
            &t.namespace("h1"),
            &exe.to_string_lossy(),
            "send",
            "-I",
            "eth0",
            &trace.to_string_lossy(),
            "--loops",
            "1000000",
            "--seconds",
            &a.seconds.to_string(),
            "--src-mac",
            "02:00:00:00:01:01",
            "--dst-mac",
            dst_mac,
            "--json",
        ],
    )?;
    // Let the last packets through before counting.
    std::thread::sleep(Duration::from_millis(100));
    let secs = started.elapsed().as_secs_f64() - 0.1;
    let (busy1, proc1) = (machine_busy_ticks()?, pid.map_or(0, process_ticks));
    let delivered = rx_packets(t, "h2", "eth0")? - rx0;
    let sent: serde_json::Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    let sent_packets = sent["sent_packets"].as_u64().unwrap_or(0);
    let mpkt = (delivered as f64 / 1e6).max(1e-9);

    // TCP from h1 to h2.
    sh(
        "ip",
        &[
            "netns",
            "exec",
            &t.namespace("h2"),
            "iperf3",
            "-s",
            "-1",
            "-D",
            "-B",
            "198.18.0.2",
        ],
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let out = sh(
        "ip",
        &[
            "netns",
            "exec",
            &t.namespace("h1"),
            "timeout",
            "60",
            "iperf3",
            "-c",
            "198.18.0.2",
            "-t",
            &a.seconds.to_string(),
            "-J",
        ],
    )?;
    let iperf: serde_json::Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    let gbps = iperf["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e9;
    let retransmits = iperf["end"]["sum_sent"]["retransmits"]
        .as_f64()
        .unwrap_or(0.0);
    Ok(Sample {
        mpps: delivered as f64 / secs / 1e6,
        sent_mpps: sent_packets as f64 / secs / 1e6,
        gbps,
        retransmits,
        machine_cpu_s_per_mpkt: (busy1 - busy0) as f64 / hz / mpkt,
        switch_cpu_s_per_mpkt: pid.map(|_| (proc1 - proc0) as f64 / hz / mpkt),
        ping_median_us,
        ping_p99_us,
    })
}

pub fn main(a: LabBenchArgs) -> BenchResult<()> {
    for (i, m) in a.modes.iter().enumerate() {
        if !MODES.contains(&m.as_str()) {
            return Err(format!(
                "--modes: '{m}' is not a mode; use some of {}",
                MODES.join(", ")
            ));
        }
        if a.modes[..i].contains(m) {
            return Err(format!("--modes: '{m}' is named twice"));
        }
    }
    if !(0.5..=600.0).contains(&a.seconds) || a.repeat == 0 || a.repeat > 50 {
        return Err("--seconds must be 0.5 to 600 and --repeat 1 to 50".into());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let hz: f64 = sh("getconf", &["CLK_TCK"])?
        .trim()
        .parse()
        .map_err(|e| format!("CLK_TCK: {e}"))?;
    let scratch = crate::Scratch::new("lab-bench")?;
    let dir = scratch.path();
    let trace = dir.join("flood.pcap");
    let out = Command::new(&exe)
        .args([
            "gen",
            "udpflood",
            "--packets",
            "100000",
            "--flows",
            "1000",
            "--seed",
            "7",
        ])
        .args(["--packet-size", &a.packet_size.to_string(), "-o"])
        .arg(&trace)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let topology_text = TOPOLOGY.replacen("name = \"line\"", "name = \"bench\"", 1);
    let topology_file = dir.join("bench.toml");
    std::fs::write(&topology_file, topology_text).map_err(|e| e.to_string())?;
    let t = Topology::load(&topology_file)?;
    let _ = stateplane_lab::down(&t.name);
    stateplane_lab::up(&t, &exe)?;
    let result = run_rounds(&t, &a, &exe, &trace, hz);
    let _ = stateplane_lab::down(&t.name);
    drop(scratch);
    let samples = result?;
    report(&a, &samples)
}

fn run_rounds(
    t: &Topology,
    a: &LabBenchArgs,
    exe: &Path,
    trace: &Path,
    hz: f64,
) -> BenchResult<Vec<(String, Vec<Sample>)>> {
    // The lab starts s1 running forward; the rounds start and stop it themselves.
    stateplane_lab::stop_switch(t, "s1")?;
    let mut samples: Vec<(String, Vec<Sample>)> =
        a.modes.iter().map(|m| (m.clone(), Vec::new())).collect();
    for round in 0..a.repeat {
        for (mode, acc) in samples.iter_mut() {
            eprint!("\rround {}/{}: {mode:<10}", round + 1, a.repeat);
            let s = start(t, mode, exe)?;
            let sample = measure(t, &s, a, exe, trace, hz);
            stop(t, &s)?;
            acc.push(sample?);
        }
    }
    eprintln!();
    Ok(samples)
}

fn report(a: &LabBenchArgs, samples: &[(String, Vec<Sample>)]) -> BenchResult<()> {
    let rows: Vec<(String, Sample)> = samples
        .iter()
        .map(|(m, v)| {
            let pick = |f: fn(&Sample) -> f64| median(v.iter().map(f).collect());
            (
                m.clone(),
                Sample {
                    mpps: pick(|s| s.mpps),
                    sent_mpps: pick(|s| s.sent_mpps),
                    gbps: pick(|s| s.gbps),
                    retransmits: pick(|s| s.retransmits),
                    machine_cpu_s_per_mpkt: pick(|s| s.machine_cpu_s_per_mpkt),
                    switch_cpu_s_per_mpkt: (v.iter().map(|s| s.switch_cpu_s_per_mpkt))
                        .collect::<Option<Vec<f64>>>()
                        .map(median),
                    ping_median_us: pick(|s| s.ping_median_us),
                    ping_p99_us: pick(|s| s.ping_p99_us),
                },
            )
        })
        .collect();
    let input = format!(
        "line topology (h1 - s1 - h2 over veth); flood: {}-byte UDP frames, 1000 flows, from h1 by `stateplane send` for {} s; veths' offloads off but in the -offloads modes; TCP: iperf3 -t {}; ping: {PINGS} from h1 to h2, 10 ms apart, on the idle path; median of {}",
        a.packet_size, a.seconds, a.seconds, a.repeat
    );
    if a.json {
        let v: Vec<_> = rows.iter().map(|(m, s)| serde_json::json!({"mode": m, "mpps": s.mpps, "offered_mpps": s.sent_mpps,
            "tcp_gbps": s.gbps, "tcp_retransmits": s.retransmits, "machine_cpu_s_per_mpkt": s.machine_cpu_s_per_mpkt, "switch_cpu_s_per_mpkt": s.switch_cpu_s_per_mpkt,
            "ping_median_us": s.ping_median_us, "ping_p99_us": s.ping_p99_us})).collect();
        println!("{}", serde_json::json!({"input": input, "results": v}));
    } else {
        println!("input: {input}");
        let mut table = Table::new(
            &["mode"],
            &[
                "Mpps",
                "offered Mpps",
                "TCP Gb/s",
                "TCP retransmits",
                "machine CPU s/Mpkt",
                "switch CPU s/Mpkt",
                "ping median µs",
                "ping p99 µs",
            ],
        );
        for (m, s) in &rows {
            table.row(vec![
                m.to_string(),
                format!("{:.3}", s.mpps),
                format!("{:.3}", s.sent_mpps),
                format!("{:.2}", s.gbps),
                format!("{:.0}", s.retransmits),
                format!("{:.2}", s.machine_cpu_s_per_mpkt),
                s.switch_cpu_s_per_mpkt
                    .map_or_else(|| "n/a (kernel)".to_owned(), |c| format!("{c:.2}")),
                format!("{:.0}", s.ping_median_us),
                format!("{:.0}", s.ping_p99_us),
            ]);
        }
        table.print();
    }
    if let Some(path) = &a.files.csv {
        let mut csv = Csv::new(
            "mode,mpps,offered_mpps,tcp_gbps,tcp_retransmits,machine_cpu_s_per_mpkt,switch_cpu_s_per_mpkt,ping_median_us,ping_p99_us",
        );
        for (m, s) in &rows {
            csv.row(format_args!(
                "{m},{:.4},{:.4},{:.3},{:.0},{:.3},{},{:.0},{:.0}",
                s.mpps,
                s.sent_mpps,
                s.gbps,
                s.retransmits,
                s.machine_cpu_s_per_mpkt,
                s.switch_cpu_s_per_mpkt
                    .map_or(String::new(), |c| format!("{c:.3}")),
                s.ping_median_us,
                s.ping_p99_us
            ));
        }
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let panel = |title: &str, unit: &str, f: fn(&Sample) -> f64| crate::chart::Panel {
            title: title.to_owned(),
            unit: unit.to_owned(),
            bars: rows.iter().map(|(m, s)| (m.clone(), f(s))).collect(),
        };
        a.files.write_chart(
            "Switching between two veths: the kernel vs stateplane forward",
            &input,
            &[
                panel(
                    "Packets per second delivered (64-byte flood)",
                    "Mpps",
                    |s| s.mpps,
                ),
                panel("TCP throughput (iperf3)", "Gbit/s", |s| s.gbps),
                panel(
                    "Machine CPU per million packets (lower is better)",
                    "s",
                    |s| s.machine_cpu_s_per_mpkt,
                ),
                panel("Ping round trip, median (lower is better)", "µs", |s| {
                    s.ping_median_us
                }),
            ],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::round_trips_us;

    #[test]
    fn round_trips_are_read_from_pings_replies_alone() {
        let out = "PING 198.18.0.2 (198.18.0.2) 56(84) bytes of data.
64 bytes from 198.18.0.2: icmp_seq=1 ttl=64 time=0.045 ms
64 bytes from 198.18.0.2: icmp_seq=2 ttl=64 time=1.31 ms
64 bytes from 198.18.0.2: icmp_seq=3 ttl=64 time=12 ms

--- 198.18.0.2 ping statistics ---
3 packets transmitted, 3 received, 0% packet loss, time 20ms
rtt min/avg/max/mdev = 0.045/4.451/12.000/5.600 ms
";
        assert_eq!(round_trips_us(out), [45, 1310, 12000]);
    }
}
