//! Replicated state in the lab, on topologies/dual-nat.toml (two switches behind `steer`,
//! Redis on the controller; the steering point chooses a path by the outside end, so that
//! `nat` can be among the programs, each setting's program put on both switches), against
//! the same switches unreplicated and stateless, in one run:
//!
//! - `stateplane lab bench-failover`: how long a TCP connection stalls when the switch
//!   carrying it dies;
//! - `stateplane lab bench-latency`: what replication adds to a packet's round trip.
//!
//! A failover trial sends a steady TCP stream from h1 to h2 (1,400 bytes every 2 ms), kills the
//! switch carrying it (SIGKILL) halfway, and measures at h2 the longest time between two
//! arrivals: the recovery time. A trial counts only if every byte arrived, in order,
//! unchanged (the two ends' SHA-256 agree). Compared in the same run: `forward`, the same
//! failover with stateless switches (what steering alone costs), and `firewall` and `nat`
//! unreplicated, whose connections cannot survive.

use crate::BenchResult;
use crate::lab_bench::{rx_packets, sh};
use crate::results::{Csv, ResultFiles, Table};
use crate::statistics::median;
use stateplane_lab::Topology;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct FailoverBenchArgs {
    /// Lease periods of the replicated firewalls and NATs to measure, in ms (100 to 60000).
    #[arg(long, value_delimiter = ',', default_value = "100,200,500,1000")]
    pub leases: Vec<u64>,
    /// Rounds (every setting in turn each round); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Seconds of each transfer; its switch is killed halfway.
    #[arg(long, default_value_t = 4.0)]
    pub seconds: f64,
    #[command(flatten)]
    pub files: ResultFiles,
    /// Print the results as JSON (for scripts) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The lab: two parallel switches behind a steering point that keeps a NAT's two
/// directions on one switch, h2 knowing the NAT's external address.
const TOPOLOGY: &str = include_str!("../../../topologies/dual-nat.toml");
const LAB: &str = "failover";

/// h2's side: takes one connection, reads it to its end (giving up after argv[1] seconds
/// without data); prints the bytes, their SHA-256 and the longest time between two
/// arrivals (ms).
const RECEIVER: &str = "import socket,hashlib,time
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)
import sys
s.bind(('198.18.0.2',5400)); s.listen(1); s.settimeout(float(sys.argv[1]))
c,_=s.accept(); c.settimeout(float(sys.argv[1]))
h=hashlib.sha256(); n=0; last=None; gap=0.0
while True:
    b=c.recv(65536)
    if not b: break
    t=time.monotonic()
    if last is not None: gap=max(gap,t-last)
    last=t; n+=len(b); h.update(b)
c.close()
print(n,h.hexdigest(),round(gap*1000,1))";

/// h1's side: sends 1,400 numbered bytes every 2 ms for argv[1] seconds, then waits for
/// the receiver to close (at most argv[2] seconds); prints the bytes and their SHA-256.
const SENDER: &str = "import socket,hashlib,time,sys
c=socket.create_connection(('198.18.0.2',5400),timeout=float(sys.argv[2]))
h=hashlib.sha256(); n=0; i=0; end=time.monotonic()+float(sys.argv[1])
while time.monotonic()<end:
    b=(b'%08d'%i)*175; c.sendall(b); h.update(b); n+=len(b); i+=1
    time.sleep(0.002)
c.shutdown(socket.SHUT_WR); c.recv(1)
print(n,h.hexdigest())";

/// The program of the parallel switches.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Program {
    Forward,
    Firewall,
    Counter,
    Nat,
}

/// What the parallel switches run in a trial: a program, its state replicated with a
/// lease (`Some`) or not.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Setting {
    program: Program,
    lease_ms: Option<u64>,
}

impl Setting {
    const FORWARD: Setting = Setting {
        program: Program::Forward,
        lease_ms: None,
    };

    fn program_name(self) -> &'static str {
        match self.program {
            Program::Forward => "forward",
            Program::Firewall => "firewall",
            Program::Counter => "counter",
            Program::Nat => "nat",
        }
    }

    fn name(self) -> String {
        match (self.program, self.lease_ms) {
            (Program::Forward, _) => "forward (stateless)".into(),
            (_, None) => format!("{}, unreplicated", self.program_name()),
            (_, Some(lease)) => format!("{}, replicated, lease {lease} ms", self.program_name()),
        }
    }

    /// As the CSV names it (no commas).
    fn key(self) -> String {
        match (self.program, self.lease_ms) {
            (Program::Forward, _) => "forward".into(),
            (_, None) => format!("{}-unreplicated", self.program_name()),
            (_, Some(_)) => format!("{}-replicated", self.program_name()),
        }
    }

    /// How long an end waits on a stalled connection before it gives up (s): past any
    /// recovery this setting can make.
    fn give_up_s(self) -> u64 {
        5 + 3 * self.lease_ms.unwrap_or(1000).div_ceil(1000)
    }

    /// Switch `index` of the topology's pair (`s`, as the topology has it) made to run
    /// this setting.
    fn apply(self, s: &mut stateplane_lab::topology::Switch, index: usize) {
        let table = |text: &str| text.parse::<toml::Table>().unwrap_or_default();
        let state = match self.program {
            Program::Forward => {
                s.program = table("name = \"forward\"");
                "none"
            }
            Program::Firewall => {
                s.program = table("name = \"firewall\"\n[firewall]\ninside = \"p0\"");
                "connections"
            }
            // Each with a pool of its own, as switches sharing a store must.
            Program::Nat => {
                let first = 20_000 + 20_000 * index;
                s.program = table(&format!(
                    "name = \"nat\"\n[nat]\ninside = \"p0\"\noutside = \"p1\"\n\
                     external = \"198.18.0.100\"\nports = \"{first}-{}\"",
                    first + 19_999
                ));
                "translations"
            }
            Program::Counter => {
                s.program =
                    table("name = \"counter\"\n[counter]\nmap = { p0 = \"p1\", p1 = \"p0\" }");
                "flows"
            }
        };
        match self.lease_ms {
            Some(lease_ms) if self.program != Program::Forward => {
                s.guarantees = Some(table(&format!("{state} = [\"replicated\"]")));
                let r = s.replication.get_or_insert_default();
                r.insert("lease_ms".into(), toml::Value::Integer(lease_ms as i64));
                r.insert("switch".into(), toml::Value::Integer(index as i64 + 1));
            }
            _ => (s.guarantees, s.replication) = (None, None),
        }
    }
}

/// One trial: the longest stall at the receiver, and whether every byte arrived.
#[derive(Clone, Copy, Debug)]
struct Trial {
    recovery_ms: f64,
    delivered: bool,
}

pub fn main(a: FailoverBenchArgs) -> BenchResult<()> {
    if let Some(bad) = a.leases.iter().find(|l| !(100..=60_000).contains(*l)) {
        return Err(format!(
            "--leases: {bad} is outside 100 to 60000 (ms), the leases a run takes"
        ));
    }
    if !(1.0..=60.0).contains(&a.seconds) || a.repeat == 0 || a.repeat > 50 {
        return Err("--seconds must be 1 to 60 and --repeat 1 to 50".into());
    }
    let mut settings = vec![Setting::FORWARD];
    for program in [Program::Firewall, Program::Nat] {
        settings.push(Setting {
            program,
            lease_ms: None,
        });
        settings.extend(a.leases.iter().map(|&lease| Setting {
            program,
            lease_ms: Some(lease),
        }));
    }
    let trials = in_lab(TOPOLOGY, |t, exe| run_rounds(t, &a, exe, &settings))?;
    report(&a, &settings, &trials)
}

/// Runs `work` on a lab of its own made from `topology` (one of the dual topologies),
/// removed after it whatever `work` returns.
fn in_lab<T>(
    topology: &str,
    work: impl FnOnce(&Topology, &Path) -> BenchResult<T>,
) -> BenchResult<T> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let scratch = crate::Scratch::new("failover")?;
    let file = scratch.path().join("failover.toml");
    let text = (topology.lines())
        .map(|l| match l.starts_with("name = \"dual") {
            true => format!("name = \"{LAB}\""),
            false => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&file, text).map_err(|e| e.to_string())?;
    let t = Topology::load(&file)?;
    let _ = stateplane_lab::down(&t.name);
    let result = stateplane_lab::up(&t, &exe).and_then(|()| work(&t, &exe));
    let _ = stateplane_lab::down(&t.name);
    result
}

fn run_rounds(
    t: &Topology,
    a: &FailoverBenchArgs,
    exe: &Path,
    settings: &[Setting],
) -> BenchResult<Vec<Vec<Trial>>> {
    let mut trials = vec![Vec::new(); settings.len()];
    for round in 0..a.repeat {
        for (i, &setting) in settings.iter().enumerate() {
            eprint!("\rround {}/{}: {:<40}", round + 1, a.repeat, setting.name());
            configure(t, exe, setting)?;
            trials[i].push(trial(t, a.seconds, setting.give_up_s())?);
        }
    }
    eprintln!();
    Ok(trials)
}

/// (Re)starts s1 and s2 with `setting`, empties the store, and waits until the steering
/// point reaches h2 through them.
fn configure(t: &Topology, exe: &Path, setting: Setting) -> BenchResult<()> {
    for node in ["s1", "s2"] {
        let _ = stateplane_lab::stop_switch(t, node);
    }
    for (index, node) in ["s1", "s2"].into_iter().enumerate() {
        let mut s = (t.switch.iter())
            .find(|s| s.name == node)
            .ok_or_else(|| format!("the topology has no switch {node}"))?
            .clone();
        setting.apply(&mut s, index);
        stateplane_lab::start_switch(t, &s, exe)?;
    }
    let redis = ["-h", "198.19.255.1", "-p", "6379", "flushall"];
    let ns = t.namespace("c1");
    sh(
        "ip",
        &[&["netns", "exec", &ns, "redis-cli"][..], &redis[..]].concat(),
    )?;
    // The steering point declares a path live once its probes come back.
    std::thread::sleep(Duration::from_millis(400));
    let ping = ["-c", "3", "-i", "0.2", "-W", "2", "198.18.0.2"];
    let h1 = t.namespace("h1");
    sh(
        "ip",
        &[&["netns", "exec", &h1, "ping"][..], &ping[..]].concat(),
    )
    .map(|_| ())
    .map_err(|e| format!("h1 does not reach h2 through the lab before the trial: {e}"))
}

fn spawn_in(t: &Topology, node: &str, args: &[&str]) -> BenchResult<Child> {
    Command::new("ip")
        .args(["netns", "exec", &t.namespace(node)])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {args:?} in {node}: {e}"))
}

/// The output of `child` once it ends, or `None` if it runs past `deadline` (killed).
fn finish(mut child: Child, deadline: Instant) -> Option<String> {
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(_)) => {
                let out = child.wait_with_output().ok()?;
                return Some(String::from_utf8_lossy(&out.stdout).trim().to_owned());
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn trial(t: &Topology, seconds: f64, give_up_s: u64) -> BenchResult<Trial> {
    let give_up = give_up_s.to_string();
    let receiver = spawn_in(t, "h2", &["python3", "-c", RECEIVER, &give_up])?;
    std::thread::sleep(Duration::from_millis(300));
    let before = [rx_packets(t, "s1", "p0")?, rx_packets(t, "s2", "p0")?];
    let sender = spawn_in(
        t,
        "h1",
        &["python3", "-c", SENDER, &seconds.to_string(), &give_up],
    )?;
    std::thread::sleep(Duration::from_secs_f64(seconds / 2.0));
    let carried = [
        rx_packets(t, "s1", "p0")? - before[0],
        rx_packets(t, "s2", "p0")? - before[1],
    ];
    let carrier = if carried[0] >= carried[1] { "s1" } else { "s2" };
    let pid_file = stateplane_lab::state_dir(&t.name).join(format!("{carrier}.pid"));
    let pid =
        std::fs::read_to_string(&pid_file).map_err(|e| format!("{}: {e}", pid_file.display()))?;
    sh("kill", &["-KILL", pid.trim()])?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds + 2.0 * give_up_s as f64);
    let sent = finish(sender, deadline);
    let received = finish(receiver, deadline);
    let (Some(sent), Some(received)) = (sent, received) else {
        // A connection that never recovers: its ends time out.
        return Ok(Trial {
            recovery_ms: f64::INFINITY,
            delivered: false,
        });
    };
    let words: Vec<&str> = received.split_whitespace().collect();
    let recovery_ms = words
        .get(2)
        .and_then(|g| g.parse().ok())
        .unwrap_or(f64::INFINITY);
    let delivered = words.len() == 3 && sent.split_whitespace().eq(words[..2].iter().copied());
    Ok(Trial {
        recovery_ms,
        delivered,
    })
}

/// The median recovery of a setting's trials that delivered everything (`None`: none did).
fn median_recovery(trials: &[Trial]) -> Option<f64> {
    let ok: Vec<f64> = (trials.iter())
        .filter(|t| t.delivered)
        .map(|t| t.recovery_ms)
        .collect();
    (!ok.is_empty()).then(|| median(ok))
}

fn report(a: &FailoverBenchArgs, settings: &[Setting], trials: &[Vec<Trial>]) -> BenchResult<()> {
    let input = format!(
        "topologies/dual-nat.toml (h1 - steer - s1|s2 - steer - h2 over veth, AF_PACKET; \
         steer chooses by h2's end, probes every 20 ms, a path dead after 150 ms; Redis on the \
         controller); one TCP \
         stream of 1,400 bytes every 2 ms for {} s, its switch killed (SIGKILL) halfway; \
         recovery = longest gap between arrivals at h2; {} rounds",
        a.seconds, a.repeat
    );
    let delivered = |v: &[Trial]| v.iter().filter(|t| t.delivered).count();
    let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |ms| format!("{ms:.0}"));
    if a.json {
        let rows: Vec<_> = (settings.iter().zip(trials))
            .map(|(s, v)| {
                serde_json::json!({"setting": s.name(), "lease_ms": s.lease_ms,
                    "median_recovery_ms": median_recovery(v), "delivered": delivered(v),
                    "trials": v.len(),
                    "recovery_ms": v.iter().map(|t| t.delivered.then_some(t.recovery_ms)).collect::<Vec<_>>()})
            })
            .collect();
        println!("{}", serde_json::json!({"input": input, "results": rows}));
    } else {
        println!("input: {input}");
        let mut table = Table::new(
            &["switches"],
            &[
                "recovery ms (median)",
                "min",
                "max",
                "every byte arrived",
                "target: max(lease, stateless) + 100 ms",
            ],
        );
        // Steering's detection and TCP's retransmission timer stall a connection through
        // stateless switches too: the floor no lease can go under, measured in this run.
        let stateless = (settings.iter().zip(trials))
            .find(|(s, _)| **s == Setting::FORWARD)
            .and_then(|(_, v)| median_recovery(v));
        for (s, v) in settings.iter().zip(trials) {
            let ok: Vec<f64> = (v.iter().filter(|t| t.delivered))
                .map(|t| t.recovery_ms)
                .collect();
            let min = ok.iter().copied().reduce(f64::min);
            let max = ok.iter().copied().reduce(f64::max);
            let target = match (s.lease_ms, median_recovery(v)) {
                (Some(lease), Some(m)) => {
                    let bound = (lease as f64).max(stateless.unwrap_or(0.0)) + 100.0;
                    let met = if m <= bound { "met" } else { "missed" };
                    format!("{bound:.0} ms: {met}")
                }
                (Some(_), None) => "nothing delivered: missed".into(),
                _ => "-".into(),
            };
            table.row(vec![
                s.name(),
                fmt(median_recovery(v)),
                fmt(min),
                fmt(max),
                format!("{} of {}", delivered(v), v.len()),
                target,
            ]);
        }
        table.print();
    }
    if let Some(path) = &a.files.csv {
        let mut csv = Csv::new("setting,lease_ms,trial,recovery_ms,delivered");
        for (s, v) in settings.iter().zip(trials) {
            for (i, t) in v.iter().enumerate() {
                csv.row(format_args!(
                    "{},{},{i},{},{}",
                    s.key(),
                    s.lease_ms.map_or(String::new(), |l| l.to_string()),
                    if t.delivered {
                        format!("{:.1}", t.recovery_ms)
                    } else {
                        String::new()
                    },
                    t.delivered
                ));
            }
        }
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let bars = (settings.iter().zip(trials))
            .filter_map(|(s, v)| Some((s.name(), median_recovery(v)?)))
            .collect();
        a.files.write_chart(
            "TCP recovery after the death of its switch",
            &input,
            &[crate::chart::Panel {
                title: "Longest stall at the receiver (median; lower is better)".into(),
                unit: "ms".into(),
                bars,
            }],
        )?;
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct LatencyBenchArgs {
    /// Echo requests per setting and round (ping -i 0.01).
    #[arg(long, default_value_t = 500)]
    pub pings: u32,
    /// Rounds (every setting in turn each round); the round trips of all are pooled.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// The replicated settings' lease, in ms.
    #[arg(long, default_value_t = 1000)]
    pub lease: u64,
    #[command(flatten)]
    pub files: ResultFiles,
    /// Print the results as JSON (for scripts) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `stateplane lab bench-latency`: ping's round trips from h1 to h2 through the parallel
/// switches, each program unreplicated and replicated. An echo's flow is written to the
/// store by `firewall` only while its state moves (the first request and reply) and by
/// `counter` at every packet, whose output then waits for the store.
pub fn main_latency(a: LatencyBenchArgs) -> BenchResult<()> {
    if !(100..=60_000).contains(&a.lease) {
        return Err(format!("--lease: {} is outside 100 to 60000 (ms)", a.lease));
    }
    if !(10..=100_000).contains(&a.pings) || a.repeat == 0 || a.repeat > 50 {
        return Err("--pings must be 10 to 100000 and --repeat 1 to 50".into());
    }
    let mut settings = vec![Setting::FORWARD];
    for program in [Program::Firewall, Program::Nat, Program::Counter] {
        for lease_ms in [None, Some(a.lease)] {
            settings.push(Setting { program, lease_ms });
        }
    }
    let rtts = in_lab(TOPOLOGY, |t, exe| {
        let mut rtts = vec![Vec::new(); settings.len()];
        for round in 0..a.repeat {
            for (i, &setting) in settings.iter().enumerate() {
                eprint!("\rround {}/{}: {:<40}", round + 1, a.repeat, setting.name());
                configure(t, exe, setting)?;
                rtts[i].extend(pings(t, a.pings)?);
            }
        }
        eprintln!();
        Ok(rtts)
    })?;
    report_latency(&a, &settings, &rtts)
}

/// The round trips (µs) of `count` echo requests from h1 to h2, every one answered.
fn pings(t: &Topology, count: u32) -> BenchResult<Vec<f64>> {
    let h1 = t.namespace("h1");
    let count = count.to_string();
    let args = [
        "netns", "exec", &h1, "ping", "-c", &count, "-i", "0.01", "-W", "2",
    ];
    let out = sh("ip", &[&args[..], &["198.18.0.2"]].concat())?;
    if !out.contains(&format!("{count} received")) {
        return Err(format!(
            "not every echo was answered: {}",
            out.lines().rev().nth(1).unwrap_or("")
        ));
    }
    Ok(out
        .lines()
        .filter_map(|l| {
            l.split("time=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
        })
        .map(|ms| ms * 1000.0)
        .collect())
}

fn report_latency(
    a: &LatencyBenchArgs,
    settings: &[Setting],
    rtts: &[Vec<f64>],
) -> BenchResult<()> {
    let input = format!(
        "topologies/dual-nat.toml (h1 - steer - s1|s2 - steer - h2 over veth, AF_PACKET, the \
         steering point choosing by h2's end; Redis on the controller, lease {} ms); \
         ping -c {} -i 0.01 from h1 to h2, {} rounds pooled",
        a.lease, a.pings, a.repeat
    );
    let quantile = |v: &[f64], q: f64| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let rows: Vec<(Setting, f64, f64)> = (settings.iter().zip(rtts))
        .map(|(s, v)| (*s, quantile(v, 0.5), quantile(v, 0.99)))
        .collect();
    let unreplicated = |s: Setting| {
        (rows.iter())
            .find(|(o, ..)| o.program == s.program && o.lease_ms.is_none())
            .map_or(f64::NAN, |r| r.1)
    };
    if a.json {
        let v: Vec<_> = (rows.iter())
            .map(|(s, p50, p99)| serde_json::json!({"setting": s.name(), "p50_us": p50, "p99_us": p99}))
            .collect();
        println!("{}", serde_json::json!({"input": input, "results": v}));
    } else {
        println!("input: {input}");
        let mut table = Table::new(
            &["switches"],
            &["p50 us", "p99 us", "p50 added by replication us"],
        );
        for (s, p50, p99) in &rows {
            let added = match s.lease_ms {
                Some(_) => format!("{:+.0}", p50 - unreplicated(*s)),
                None => "-".into(),
            };
            table.row(vec![
                s.name(),
                format!("{p50:.0}"),
                format!("{p99:.0}"),
                added,
            ]);
        }
        table.print();
    }
    if let Some(path) = &a.files.csv {
        let mut csv = Csv::new("setting,echo,rtt_us");
        for (s, v) in settings.iter().zip(rtts) {
            for (i, us) in v.iter().enumerate() {
                csv.row(format_args!("{},{i},{us:.1}", s.key()));
            }
        }
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let panel = |title: &str, f: fn(&(Setting, f64, f64)) -> f64| crate::chart::Panel {
            title: title.to_owned(),
            unit: "us".into(),
            bars: rows.iter().map(|r| (r.0.name(), f(r))).collect(),
        };
        a.files.write_chart(
            "Round trip through replicated switches (ping)",
            &input,
            &[
                panel("Median round trip", |r| r.1),
                panel("99th percentile", |r| r.2),
            ],
        )?;
    }
    Ok(())
}
