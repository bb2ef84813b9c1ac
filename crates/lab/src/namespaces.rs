//! `up`, `down`, `status` and `exec`: the lab's life cycle, carried out with iproute2 and
//! ethtool so that every step is one a user could type and check.

use crate::topology::{Kind, Topology, namespace};
use stateplane_control::endpoint::RUN_DIR_VAR;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where labs keep their switch configurations, logs and process ids (`/run`: gone at
/// reboot, like the namespaces themselves).
pub fn state_dir(lab: &str) -> PathBuf {
    let base = std::env::var_os("STATEPLANE_LAB_DIR")
        .map_or_else(|| PathBuf::from("/run/stateplane/lab"), PathBuf::from);
    base.join(lab)
}

/// A switch's run directory, which holds its control socket: the namespaces share one
/// filesystem, so each switch has its own, and `lab exec` gives it to commands run in the
/// switch's namespace (so that a plain `stateplane ctl` there reaches that switch).
pub fn run_dir(lab: &str, switch: &str) -> PathBuf {
    state_dir(lab).join(switch)
}

/// Where every switch serves Prometheus metrics, inside its namespace.
pub const METRICS: &str = "127.0.0.1:9464";

/// Runs a command; its stderr is the error.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!(
                "{program} is not installed (Debian: {})",
                match program {
                    "ip" => "apt-get install iproute2",
                    "ethtool" => "apt-get install ethtool",
                    _ => "see the README",
                }
            ),
            _ => format!("running {program}: {e}"),
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<String, String> {
    run("ip", args)
}

/// The lab's namespaces that exist now.
/// Sets a kernel parameter (`name=value`) in namespace `ns`.
fn sysctl(ns: &str, setting: &str) -> Result<String, String> {
    run("ip", &["netns", "exec", ns, "sysctl", "-qw", setting])
}

fn lab_namespaces(lab: &str) -> Result<Vec<String>, String> {
    let prefix = namespace(lab, "");
    Ok(ip(&["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_owned)
        .collect())
}

/// Process ids running in namespace `ns`.
fn namespace_pids(ns: &str) -> Vec<u32> {
    ip(&["netns", "pids", ns])
        .map(|out| {
            out.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether this process runs as root (effective uid 0, from /proc/self/status).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let uids = s.lines().find(|l| l.starts_with("Uid:"))?.to_owned();
            uids.split_whitespace().nth(2).map(|euid| euid == "0")
        })
        .unwrap_or(false)
}

/// The lab's one privilege check, so that a user sees the fix rather than `ip`'s refusal.
fn require_root() -> Result<(), String> {
    if is_root() {
        Ok(())
    } else {
        Err("the lab creates network namespaces, veth links and raw sockets: run stateplane lab as root".into())
    }
}

/// Creates the lab and starts its switches; on any failure removes what it made.
pub fn up(t: &Topology, stateplane: &Path) -> Result<(), String> {
    require_root()?;
    if !lab_namespaces(&t.name)?.is_empty() {
        return Err(format!(
            "lab '{}' is already up (or was left behind by a crash): run `stateplane lab down` on it first",
            t.name
        ));
    }
    let result = build(t, stateplane);
    if result.is_err() {
        let _ = down(&t.name);
    }
    result
}

fn build(t: &Topology, stateplane: &Path) -> Result<(), String> {
    let dir = state_dir(&t.name);
    fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    for node in t.nodes() {
        let ns = t.namespace(node);
        ip(&["netns", "add", &ns])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        if t.kind(node) == Some(Kind::Switch) {
            // A switch's ports are raw: no addresses, no IPv6 autoconfiguration chatter.
            for key in ["all", "default"] {
                sysctl(&ns, &format!("net.ipv6.conf.{key}.disable_ipv6=1"))?;
            }
        }
    }
    for l in &t.link {
        let (na, nb) = (t.namespace(&l.a.node), t.namespace(&l.b.node));
        ip(&[
            "link", "add", &l.a.iface, "netns", &na, "type", "veth", "peer", "name", &l.b.iface,
            "netns", &nb,
        ])?;
        for (end, ns) in [(&l.a, &na), (&l.b, &nb)] {
            if let Some(mac) = &end.mac {
                ip(&["-n", ns, "link", "set", &end.iface, "address", mac])?;
            }
            if let Some(mtu) = end.mtu {
                ip(&["-n", ns, "link", "set", &end.iface, "mtu", &mtu.to_string()])?;
            }
            if let Some(addr) = &end.addr {
                ip(&["-n", ns, "addr", "add", addr, "dev", &end.iface])?;
            }
            // Whole, checksummed frames on the wire: a software switch reading a veth sees
            // what the sender's stack left to offload otherwise (64 KiB TSO segments,
            // unfinished checksums).
            run(
                "ip",
                &[
                    "netns", "exec", ns, "ethtool", "-K", &end.iface, "tx", "off", "tso", "off",
                    "gso", "off", "gro", "off",
                ],
            )?;
            ip(&["-n", ns, "link", "set", &end.iface, "up"])?;
        }
    }
    if let (Some(c), Some((caddr, saddrs))) = (&t.controller, t.management()?) {
        let cns = t.namespace(&c.name);
        ip(&["-n", &cns, "link", "add", "mgmt", "type", "bridge"])?;
        ip(&["-n", &cns, "addr", "add", &caddr, "dev", "mgmt"])?;
        ip(&["-n", &cns, "link", "set", "mgmt", "up"])?;
        for (s, addr) in t.switch.iter().zip(&saddrs) {
            let sns = t.namespace(&s.name);
            let port = format!("m-{}", s.name);
            ip(&[
                "link", "add", "mgmt", "netns", &sns, "type", "veth", "peer", "name", &port,
                "netns", &cns,
            ])?;
            ip(&["-n", &cns, "link", "set", &port, "master", "mgmt", "up"])?;
            ip(&["-n", &sns, "addr", "add", addr, "dev", "mgmt"])?;
            ip(&["-n", &sns, "link", "set", "mgmt", "up"])?;
        }
    }
    for h in &t.host {
        let ns = t.namespace(&h.name);
        if h.forwarding {
            sysctl(&ns, "net.ipv4.ip_forward=1")?;
        }
        for r in &h.routes {
            let mut args = vec!["-n", ns.as_str(), "route", "add"];
            args.extend(r.split_whitespace());
            ip(&args)?;
        }
        for n in &h.neighbors {
            ip(&[
                "-n",
                &ns,
                "neigh",
                "replace",
                &n.addr,
                "lladdr",
                &n.mac,
                "dev",
                &n.iface,
                "nud",
                "permanent",
            ])?;
        }
    }
    if let (Some(c), Some((caddr, _))) = (&t.controller, t.management()?)
        && let Some(port) = c.redis
    {
        start_redis(t, &c.name, caddr.trim_end_matches("/24"), port)?;
    }
    for s in &t.switch {
        start_switch(t, s, stateplane)?;
    }
    wait_for_carrier(t);
    Ok(())
}

/// Starts redis-server in the controller's namespace at `addr:port` (no persistence; its
/// log in the lab's directory) and waits (5 s at most) until it answers. `down` stops it
/// with the namespace's other processes.
fn start_redis(t: &Topology, controller: &str, addr: &str, port: u16) -> Result<(), String> {
    let ns = t.namespace(controller);
    let log_path = state_dir(&t.name).join(format!("{controller}-redis.log"));
    let log =
        fs::File::create(&log_path).map_err(|e| format!("creating {}: {e}", log_path.display()))?;
    let port = port.to_string();
    Command::new("ip")
        .args(["netns", "exec", &ns, "redis-server", "--bind", addr])
        .args(["--port", &port, "--save", "", "--appendonly", "no"])
        // The management network is the lab's own, with no route out: the switches reach
        // the server there, not on its loopback, which protected mode would refuse.
        .args(["--protected-mode", "no"])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| {
            format!("starting redis-server in {ns}: {e} (apt-get install redis-server)")
        })?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let pong = Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns,
                "redis-cli",
                "-h",
                addr,
                "-p",
                &port,
                "ping",
            ])
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"PONG"));
        if pong {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "redis-server in {ns} did not answer at {addr}:{port} within 5 s; see {}",
        log_path.display()
    ))
}

/// Waits (at most 3 s) until every link end has carrier: a veth reports it a moment after
/// both ends are up, and again after an XDP program is attached.
fn wait_for_carrier(t: &Topology) {
    let mut ends: Vec<(String, String)> = t
        .link
        .iter()
        .flat_map(|l| [&l.a, &l.b])
        .map(|e| (e.node.clone(), e.iface.clone()))
        .collect();
    if let Some(c) = &t.controller {
        for s in &t.switch {
            ends.push((s.name.clone(), "mgmt".into()));
            ends.push((c.name.clone(), format!("m-{}", s.name)));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let down: Vec<String> = ends
            .iter()
            .filter(|(node, iface)| {
                let out = ip(&["-n", &t.namespace(node), "-br", "link", "show", iface]);
                !out.is_ok_and(|o| o.split_whitespace().nth(1) == Some("UP"))
            })
            .map(|(node, iface)| format!("{node}:{iface}"))
            .collect();
        if down.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            log::warn!("no carrier yet on {}", down.join(", "));
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes the switch's `stateplane run` configuration and starts it in its namespace;
/// returns its process id once it reports running.
pub fn start_switch(
    t: &Topology,
    s: &crate::topology::Switch,
    stateplane: &Path,
) -> Result<u32, String> {
    let dir = state_dir(&t.name);
    let mut config = toml::Table::new();
    if let Some(w) = s.workers {
        config.insert("workers".into(), toml::Value::Integer(w as i64));
    }
    if let Some(io) = &s.io {
        config.insert("io".into(), toml::Value::String(io.clone()));
    }
    // Each switch has its own loopback, so every one serves metrics on the same address:
    // `stateplane lab exec LAB s1 curl 127.0.0.1:9464/metrics`.
    config.insert("metrics".into(), METRICS.into());
    config.insert("program".into(), toml::Value::Table(s.program.clone()));
    for (key, table) in [
        ("guarantees", &s.guarantees),
        ("sync", &s.sync),
        ("replication", &s.replication),
    ] {
        if let Some(t) = table {
            config.insert(key.into(), toml::Value::Table(t.clone()));
        }
    }
    let ports: Vec<toml::Value> = t
        .switch_ports(&s.name)
        .into_iter()
        .map(|p| {
            let mut port = toml::Table::new();
            port.insert("name".into(), p.into());
            port.insert("iface".into(), p.into());
            toml::Value::Table(port)
        })
        .collect();
    config.insert("port".into(), toml::Value::Array(ports));
    let text = toml::to_string(&config).map_err(|e| e.to_string())?;
    let cfg_path = dir.join(format!("{}.toml", s.name));
    let log_path = dir.join(format!("{}.log", s.name));
    fs::write(&cfg_path, text).map_err(|e| format!("writing {}: {e}", cfg_path.display()))?;
    let log =
        fs::File::create(&log_path).map_err(|e| format!("creating {}: {e}", log_path.display()))?;
    let log2 = log.try_clone().map_err(|e| e.to_string())?;
    let ns = t.namespace(&s.name);
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(stateplane)
        .args(["run", "--config"])
        .env(RUN_DIR_VAR, run_dir(&t.name, &s.name))
        .arg(&cfg_path)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        // Its own process group: a Ctrl-C meant for `lab up` must not stop the switches.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting stateplane in {ns}: {e}"))?;
    fs::write(dir.join(format!("{}.pid", s.name)), child.id().to_string())
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = fs::read_to_string(&log_path).unwrap_or_default();
        if text.contains("SIGINT or SIGTERM stops") {
            log::info!("{}: running (pid {})", s.name, child.id());
            return Ok(child.id());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "switch {} exited ({status}) while starting; its log ({}):\n{}",
                s.name,
                log_path.display(),
                text.trim_end()
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "switch {} did not report running within 10 s; see {}",
                s.name,
                log_path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops switch `node`'s `stateplane` (SIGTERM: it drains and reports into its log) and
/// waits for it to exit.
pub fn stop_switch(t: &Topology, node: &str) -> Result<(), String> {
    let pid_file = state_dir(&t.name).join(format!("{node}.pid"));
    let pid = fs::read_to_string(&pid_file)
        .map_err(|e| format!("{}: {e}", pid_file.display()))?
        .trim()
        .to_owned();
    let ns = t.namespace(node);
    let _ = run("kill", &["-TERM", &pid]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while namespace_pids(&ns).iter().any(|p| p.to_string() == pid) {
        if Instant::now() > deadline {
            let _ = run("kill", &["-KILL", &pid]);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Stops every process in the lab's namespaces and removes them; returns what it removed.
/// Works from the namespace names alone, so it also cleans up after a crash.
pub fn down(lab: &str) -> Result<Vec<String>, String> {
    require_root()?;
    let namespaces = lab_namespaces(lab)?;
    for signal in ["TERM", "KILL"] {
        let pids: Vec<String> = namespaces
            .iter()
            .flat_map(|ns| namespace_pids(ns))
            .map(|p| p.to_string())
            .collect();
        if pids.is_empty() {
            break;
        }
        let mut args = vec![format!("-{signal}")];
        args.extend(pids);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let _ = run("kill", &args);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline
            && namespaces.iter().any(|ns| !namespace_pids(ns).is_empty())
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for ns in &namespaces {
        // Deleting a namespace deletes its veth ends, and with them their peers.
        ip(&["netns", "del", ns])?;
    }
    let dir = state_dir(lab);
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    Ok(namespaces)
}

/// One node's state, as `status` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub node: String,
    pub kind: &'static str,
    pub namespace: String,
    pub present: bool,
    /// For switches: the pid of its `stateplane`, if it runs.
    pub process: Option<u32>,
    /// `name state addresses` per interface, as `ip -br addr` prints them.
    pub interfaces: Vec<String>,
}

pub fn status(t: &Topology) -> Result<Vec<NodeStatus>, String> {
    let present = lab_namespaces(&t.name)?;
    let dir = state_dir(&t.name);
    Ok(t.nodes()
        .into_iter()
        .map(|node| {
            let ns = t.namespace(node);
            let here = present.contains(&ns);
            let kind = match t.kind(node) {
                Some(Kind::Host) => "host",
                Some(Kind::Switch) => "switch",
                _ => "controller",
            };
            let process = if here && kind == "switch" {
                let pid = fs::read_to_string(dir.join(format!("{node}.pid")))
                    .ok()
                    .and_then(|p| p.trim().parse::<u32>().ok());
                pid.filter(|p| namespace_pids(&ns).contains(p))
            } else {
                None
            };
            let interfaces = if here {
                ip(&["-n", &ns, "-br", "addr"])
                    .map(|o| {
                        o.lines()
                            .filter(|l| !l.starts_with("lo "))
                            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                            .collect()
                    })
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            NodeStatus {
                node: node.to_owned(),
                kind,
                namespace: ns,
                present: here,
                process,
                interfaces,
            }
        })
        .collect())
}

/// Runs `command` in `node`'s namespace, inheriting stdin/stdout/stderr; returns its exit
/// code.
pub fn exec(t: &Topology, node: &str, command: &[String]) -> Result<i32, String> {
    if t.kind(node).is_none() {
        return Err(format!(
            "there is no node '{node}'; the nodes are: {}",
            t.nodes().join(", ")
        ));
    }
    let Some((program, args)) = command.split_first() else {
        return Err("give the command to run after the node".into());
    };
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", &t.namespace(node), program])
        .args(args);
    if t.kind(node) == Some(Kind::Switch) {
        command.env(RUN_DIR_VAR, run_dir(&t.name, node));
    }
    let status = command
        .status()
        .map_err(|e| format!("running ip netns exec: {e}"))?;
    Ok(status.code().unwrap_or(1))
}
