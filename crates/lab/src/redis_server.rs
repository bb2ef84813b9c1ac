//! A redis-server of a test's or an experiment's own, on loopback: started on a port with a
//! directory of its own, stopped (killed) when dropped, and restartable on the same port
//! and directory, so that what it keeps across a restart (its append-only file) is tested.
//!
//! Must never: listen beyond 127.0.0.1, or leave the server running after it is dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    append_only: bool,
    /// Options beyond the port, directory and persistence (`--cluster-enabled yes`).
    extra: Vec<String>,
    child: Option<Child>,
}

/// A loopback port nothing listens on now, for a server of a test's or an experiment's
/// own.
pub fn free_loopback_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("a free loopback port: {e}"))
}

/// Whether `tool` is on the PATH.
fn installed(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

impl RedisServer {
    /// Starts a server on `port` (127.0.0.1), keeping its files in a fresh directory;
    /// `append_only`: with an append-only file, fsynced every write (`appendfsync always`).
    pub fn start(port: u16, append_only: bool) -> Result<RedisServer, String> {
        RedisServer::start_with(port, append_only, &[])
    }

    /// As [`RedisServer::start`], with more options for redis-server (`extra`).
    pub fn start_with(port: u16, append_only: bool, extra: &[&str]) -> Result<RedisServer, String> {
        for tool in ["redis-server", "redis-cli"] {
            if !installed(tool) {
                return Err(format!(
                    "{tool} is not installed: run scripts/test.sh, which installs it \
                     (apt-get install redis-server redis-tools)"
                ));
            }
        }
        let dir =
            std::env::temp_dir().join(format!("stateplane-redis-{port}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut server = RedisServer {
            port,
            dir,
            append_only,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        server.restart()?;
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts three servers as the masters of a Redis Cluster (no replicas), on `ports`,
    /// and waits until the cluster says it is ok.
    pub fn cluster(ports: [u16; 3]) -> Result<Vec<RedisServer>, String> {
        let servers = ports
            .iter()
            .map(|&p| {
                RedisServer::start_with(
                    p,
                    false,
                    &["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"],
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
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
    /// waiting until it answers.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", if self.append_only { "yes" } else { "no" }])
            .args(["--appendfsync", "always"])
            .args(&self.extra)
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))?;
        self.child = Some(child);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if self.cli(&["ping"]).trim() == "PONG" {
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
