//! A redis-server of a test's or an experiment's own, on loopback: started on a port with a
//! directory of its own, stopped (killed) when dropped, and restartable on the same port
//! and directory, so that what it keeps across a restart (its append-only file) is tested.
//!
//! Must never: listen beyond 127.0.0.1, or leave the server running after it is dropped.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    append_only: bool,
    /// Options beyond the port, directory and persistence (`--cluster-enabled yes`).
    extra: Vec<String>,
    /// The port it also listens on with TLS, if any.
    tls_port: Option<u16>,
    /// A sentinel's configuration file (in `dir`, which the sentinel rewrites): it runs
    /// as a Redis Sentinel, not as a server.
    sentinel_conf: Option<PathBuf>,
    child: Option<Child>,
}

/// A loopback port nothing listens on now and that no earlier call in this process handed
/// out, for a server of a test's or an experiment's own. The kernel may give a port it
/// gave before once the port is closed again, and tests that run at once in one process
/// start their servers only after asking: without the record, two servers of one cluster
/// have been given the same port.
pub fn free_loopback_port() -> Result<u16, String> {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    for _ in 0..64 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("a free loopback port: {e}"))?;
        // A test that panicked while holding the record leaves it whole: take it as is.
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if handed_out.insert(port) {
            return Ok(port);
        }
    }
    Err("a free loopback port: the kernel gave only ports handed out before, 64 times".into())
}

/// How far above a Redis Cluster node's port its cluster bus listens (Redis's default).
const CLUSTER_BUS_OFFSET: u16 = 10_000;

/// The cluster bus port of a node on `port`, if it is a port.
fn bus_port(port: u16) -> Option<u16> {
    port.checked_add(CLUSTER_BUS_OFFSET)
}

/// A loopback port for a Redis Cluster node ([`free_loopback_port`]) whose cluster bus
/// port, 10,000 above it, is a port too and free now: a node listens on both, and one
/// whose bus port is taken (an outgoing connection's, in the ephemeral range) exits at
/// start.
fn free_cluster_port() -> Result<u16, String> {
    for _ in 0..64 {
        let port = free_loopback_port()?;
        let bus_free = bus_port(port)
            .is_some_and(|bus| std::net::TcpListener::bind(("127.0.0.1", bus)).is_ok());
        if bus_free {
            return Ok(port);
        }
    }
    Err("a free loopback port for a cluster node: none of 64 had its bus port free".into())
}

/// `N` ports of [`free_cluster_port`].
fn free_cluster_ports<const N: usize>() -> Result<[u16; N], String> {
    let mut ports = [0; N];
    for port in &mut ports {
        *port = free_cluster_port()?;
    }
    Ok(ports)
}

/// Whether `tool` is on the PATH.
fn installed(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A fresh directory for a server of `kind` on `port`, once redis-server and redis-cli
/// are found installed.
fn fresh_dir(kind: &str, port: u16) -> Result<PathBuf, String> {
    for tool in ["redis-server", "redis-cli"] {
        if !installed(tool) {
            return Err(format!(
                "{tool} is not installed: run scripts/test.sh, which installs it \
                 (apt-get install redis-server redis-tools)"
            ));
        }
    }
    let dir = std::env::temp_dir().join(format!("stateplane-{kind}-{port}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

impl RedisServer {
    /// Starts a server on `port` (127.0.0.1), keeping its files in a fresh directory;
    /// `append_only`: with an append-only file, fsynced every write (`appendfsync always`).
    pub fn start(port: u16, append_only: bool) -> Result<RedisServer, String> {
        RedisServer::start_with(port, append_only, &[])
    }

    /// As [`RedisServer::start`], with more options for redis-server (`extra`).
    pub fn start_with(port: u16, append_only: bool, extra: &[&str]) -> Result<RedisServer, String> {
        let dir = fresh_dir("redis", port)?;
        let mut server = RedisServer {
            port,
            dir,
            append_only,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            tls_port: None,
            sentinel_conf: None,
            child: None,
        };
        server.restart()?;
        Ok(server)
    }

    /// As [`RedisServer::start`], listening with TLS on `tls_port` too: `files` are its
    /// certificate, its key and a CA's certificate (PEM), against which clients'
    /// certificates are checked (`tls-auth-clients yes`) when `ask_clients`; none are asked
    /// for otherwise. The plain port stays, for the tests' own looks ([`RedisServer::cli`]).
    pub fn start_tls(
        port: u16,
        tls_port: u16,
        files: &[PathBuf; 3],
        ask_clients: bool,
    ) -> Result<RedisServer, String> {
        RedisServer::start_tls_with(port, tls_port, files, ask_clients, &[])
    }

    fn start_tls_with(
        port: u16,
        tls_port: u16,
        [cert, key, ca]: &[PathBuf; 3],
        ask_clients: bool,
        extra: &[&str],
    ) -> Result<RedisServer, String> {
        let path = |p: &PathBuf| p.display().to_string();
        let tls_port_text = tls_port.to_string();
        let (cert, key, ca) = (path(cert), path(key), path(ca));
        let mut args = vec![
            "--tls-port",
            &tls_port_text,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            if ask_clients { "yes" } else { "no" },
        ];
        args.extend(extra);
        let mut server = RedisServer::start_with(port, false, &args)?;
        server.tls_port = Some(tls_port);
        Ok(server)
    }

    /// A Redis Sentinel on `port` (127.0.0.1) watching the master at `master_port` under
    /// the name `name`, a quorum of its own: it calls the master down after a second
    /// without an answer and fails over to one of its replicas (then points the others at
    /// it). Its [`RedisServer::cli`] is the sentinel's (`sentinel replicas NAME`).
    pub fn sentinel(port: u16, name: &str, master_port: u16) -> Result<RedisServer, String> {
        RedisServer::sentinel_with(port, name, master_port, None)
    }

    /// As [`RedisServer::sentinel`], also listening with TLS on `tls_port` and watching
    /// the master over TLS (`master_port` its TLS port, `tls-replication yes`), with the
    /// certificate files of [`RedisServer::start_tls`] (clients are not asked for one).
    pub fn tls_sentinel(
        port: u16,
        tls_port: u16,
        name: &str,
        master_port: u16,
        files: &[PathBuf; 3],
    ) -> Result<RedisServer, String> {
        RedisServer::sentinel_with(port, name, master_port, Some((tls_port, files)))
    }

    fn sentinel_with(
        port: u16,
        name: &str,
        master_port: u16,
        tls: Option<(u16, &[PathBuf; 3])>,
    ) -> Result<RedisServer, String> {
        let dir = fresh_dir("sentinel", port)?;
        let conf = dir.join("sentinel.conf");
        let tls_lines = match tls {
            None => String::new(),
            Some((tls_port, [cert, key, ca])) => format!(
                "tls-port {tls_port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
                 tls-auth-clients no\ntls-replication yes\n",
                cert.display(),
                key.display(),
                ca.display()
            ),
        };
        let text = format!(
            "port {port}\nbind 127.0.0.1\ndir {}\n{tls_lines}\
             sentinel monitor {name} 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds {name} 1000\n\
             sentinel failover-timeout {name} 3000\n",
            dir.display()
        );
        std::fs::write(&conf, text).map_err(|e| format!("{}: {e}", conf.display()))?;
        let mut sentinel = RedisServer {
            port,
            dir,
            append_only: false,
            extra: Vec::new(),
            tls_port: tls.map(|(tls_port, _)| tls_port),
            sentinel_conf: Some(conf),
            child: None,
        };
        sentinel.restart()?;
        Ok(sentinel)
    }

    /// The port it listens on with TLS, if any.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// The URL of its TLS port (`rediss://`), if it has one.
    pub fn tls_url(&self) -> Option<String> {
        (self.tls_port).map(|port| format!("rediss://127.0.0.1:{port}/"))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts three servers as the masters of a Redis Cluster (no replicas), on free
    /// loopback ports, and waits until the cluster says it is ok.
    pub fn cluster() -> Result<Vec<RedisServer>, String> {
        RedisServer::cluster_of(&free_cluster_ports::<3>()?, 0, None)
    }

    /// Starts six servers as a Redis Cluster of three masters with a replica each, on
    /// free loopback ports, and waits until the cluster says it is ok and every replica has synced
    /// with its master. Which server is which is the cluster's choice: the masters first
    /// in the list returned, each replica at its master's index plus three. A master that
    /// does not answer for a second (`cluster-node-timeout`) is failed over to its
    /// replica.
    pub fn cluster_with_replicas() -> Result<Vec<RedisServer>, String> {
        let ports = free_cluster_ports::<6>()?;
        let servers = RedisServer::cluster_of(&ports, 1, None)?;
        let id = |s: &RedisServer| s.cli(&["cluster", "myid"]).trim().to_string();
        // A replica's line of its own in CLUSTER NODES: `ID ADDR myself,slave MASTER ...`.
        let master_of = |s: &RedisServer| {
            let nodes = s.cli(&["cluster", "nodes"]);
            let fields: Vec<String> = (nodes.lines().find(|l| l.contains("myself")))?
                .split_whitespace()
                .map(str::to_string)
                .collect();
            (fields.get(2)?.contains("slave")).then(|| fields.get(3).cloned())?
        };
        let (mut replicas, mut ordered): (Vec<_>, Vec<_>) =
            servers.into_iter().partition(|s| master_of(s).is_some());
        for i in 0..ordered.len() {
            let master = id(&ordered[i]);
            let at = (replicas
                .iter()
                .position(|r| master_of(r) == Some(master.clone())))
            .ok_or_else(|| format!("no replica of the master on port {}", ordered[i].port))?;
            let replica = replicas.swap_remove(at);
            let start = Instant::now();
            while !(replica.cli(&["info", "replication"])).contains("master_link_status:up") {
                if start.elapsed() > Duration::from_secs(10) {
                    return Err(format!(
                        "the replica on port {} did not sync within 10 s",
                        replica.port
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            ordered.push(replica);
        }
        if ordered.len() != ports.len() {
            return Err("the cluster did not make three masters of one replica each".into());
        }
        Ok(ordered)
    }

    /// As [`RedisServer::cluster`], each master listening with TLS on a port of its own
    /// too, with the certificate files of [`RedisServer::start_tls`] (clients are not asked
    /// for one), and the cluster's own links over TLS (`tls-cluster yes`): a client that
    /// comes over TLS is sent to the masters' TLS ports.
    pub fn tls_cluster(files: &[PathBuf; 3]) -> Result<Vec<RedisServer>, String> {
        let tls_ports = free_cluster_ports::<3>()?;
        RedisServer::cluster_of(&free_cluster_ports::<3>()?, 0, Some((&tls_ports, files)))
    }

    /// A cluster of `ports`' servers, `replicas` of each master (`redis-cli --cluster
    /// create`), in the order started; each port's bus port, 10,000 above it, must be
    /// free too ([`free_cluster_port`]).
    fn cluster_of(
        ports: &[u16],
        replicas: usize,
        tls: Option<(&[u16], &[PathBuf; 3])>,
    ) -> Result<Vec<RedisServer>, String> {
        let cluster_args = [
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            "2000",
            // A replica's full sync starts at once (not after Redis 7's five seconds).
            "--repl-diskless-sync-delay",
            "0",
        ];
        let mut servers = Vec::new();
        for (i, &port) in ports.iter().enumerate() {
            let server = match tls {
                None => RedisServer::start_with(port, false, &cluster_args)?,
                Some((tls_ports, files)) => {
                    let mut extra = cluster_args.to_vec();
                    extra.extend(["--tls-cluster", "yes"]);
                    RedisServer::start_tls_with(port, tls_ports[i], files, false, &extra)?
                }
            };
            servers.push(server);
        }
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        match tls {
            None => create.args(ports.iter().map(|p| format!("127.0.0.1:{p}"))),
            Some((tls_ports, [_, _, ca])) => create
                .args(tls_ports.iter().map(|p| format!("127.0.0.1:{p}")))
                .arg("--tls")
                .arg("--cacert")
                .arg(ca),
        };
        let mut create = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
        // redis-cli waits without end for the nodes to know one another. On Redis 7.0 two
        // MEETs reaching one node at once have left two nodes of three never knowing the
        // third (CI, 2026-12-06): every few seconds, each node is told of every other
        // again (a node it knows already is unchanged), and past 30 s it is an error.
        let announced = tls.map_or(ports, |(tls_ports, _)| tls_ports);
        let start = Instant::now();
        let mut last_meet = start;
        let status = loop {
            if let Some(status) = create.try_wait().map_err(|e| format!("redis-cli: {e}"))? {
                break status;
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = create.kill();
                let _ = create.wait();
                return Err(
                    "redis-cli --cluster create: the nodes did not join within 30 s".into(),
                );
            }
            if last_meet.elapsed() > Duration::from_secs(3) {
                last_meet = Instant::now();
                for server in &servers {
                    let others = ports
                        .iter()
                        .zip(announced)
                        .filter(|(p, _)| **p != server.port);
                    for (&port, &announce) in others {
                        let Some(bus) = bus_port(port) else { continue };
                        let bus = bus.to_string();
                        let announce = announce.to_string();
                        server.cli(&["cluster", "meet", "127.0.0.1", &announce, &bus]);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !status.success() {
            let mut said = String::new();
            if let Some(mut out) = create.stdout.take() {
                let _ = std::io::Read::read_to_string(&mut out, &mut said);
            }
            return Err(format!("redis-cli --cluster create: {said}"));
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if servers
                .iter()
                .all(|s| s.cli(&["cluster", "info"]).contains("cluster_state:ok"))
            {
                return Ok(servers);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err("the Redis Cluster did not reach cluster_state:ok within 10 s".into())
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server (SIGKILL: nothing is flushed that was not already).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs and starts it again on the same port and directory,
    /// waiting until it answers as the process started.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let mut command = Command::new("redis-server");
        match &self.sentinel_conf {
            Some(conf) => command.arg(conf).arg("--sentinel"),
            None => command
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", ""])
                .args(["--appendonly", if self.append_only { "yes" } else { "no" }])
                .args(["--appendfsync", "always"])
                .args(&self.extra)
                .arg("--dir")
                .arg(&self.dir),
        };
        let child =
            (command.stdout(Stdio::null()).spawn()).map_err(|e| format!("redis-server: {e}"))?;
        // The answer must come from this process: a server another test started on the
        // same port answers too, and this one then exits, unable to listen.
        let own_process = format!("process_id:{}", child.id());
        self.child = Some(child);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            let exited = (self.child.as_mut()).and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                return Err(format!(
                    "redis-server on port {} exited at start ({status}): is the port taken?",
                    self.port
                ));
            }
            let info = self.cli(&["info", "server"]);
            if info.lines().any(|line| line.trim() == own_process) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err(format!(
            "redis-server did not answer on port {} within 5 s",
            self.port
        ))
    }

    /// Stops the server's process (SIGSTOP) until [`RedisServer::resume`]: a server that
    /// neither answers nor goes away, as a replica cut off from its master is.
    pub fn pause(&self) -> Result<(), String> {
        self.signal("STOP")
    }

    pub fn resume(&self) -> Result<(), String> {
        self.signal("CONT")
    }

    fn signal(&self, name: &str) -> Result<(), String> {
        let pid = (self.child.as_ref())
            .ok_or_else(|| format!("the server on port {} is not running", self.port))?
            .id();
        let sent = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status()
            .is_ok_and(|s| s.success());
        if sent {
            Ok(())
        } else {
            Err(format!("kill -{name} {pid} failed"))
        }
    }

    /// `redis-cli` against the server: its output.
    pub fn cli(&self, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Thousands of asks in one process never repeat a port, though the kernel, asked as
    /// often, gives some port twice.
    #[test]
    fn no_port_is_handed_out_twice() {
        let mut seen = BTreeSet::new();
        for _ in 0..3000 {
            let port = free_loopback_port().unwrap();
            assert!(seen.insert(port), "port {port} handed out twice");
        }
    }

    /// A server started on a port another server holds is refused, not taken for the one
    /// that answers there.
    #[test]
    fn a_server_on_a_taken_port_is_refused_and_says_so() {
        let port = free_loopback_port().unwrap();
        let first = RedisServer::start(port, false).unwrap();
        let err = RedisServer::start(port, false).err().unwrap();
        assert!(err.contains("port"), "{err}");
        assert_eq!(first.cli(&["ping"]).trim(), "PONG");
    }
}
