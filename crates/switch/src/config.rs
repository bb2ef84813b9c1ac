//! The TOML configuration of `stateplane run`. Unknown keys are errors that name the key.
//!
//! ```toml
//! workers = 2          # worker threads (default 1)
//! burst = 64           # packets per burst (default 64)
//! metrics = "127.0.0.1:9464"   # optional Prometheus endpoint, loopback only
//!
//! [program]
//! name = "l2"          # see `stateplane run --help` for the catalog
//! [program.l2]         # the program's own settings
//! macs = [ { mac = "02:00:00:00:00:02", port = "out" } ]
//!
//! [[port]]
//! name = "in"
//! rx = "trace.pcap"    # read packets from this capture (relative paths: to this file,
//!                      # as are the `*_file` paths of a program's settings)
//! [[port]]
//! name = "out"
//! tx = "out.pcap"      # write packets sent to this port (omit: count and discard)
//! ```
//!
//! Flow records of what the program forwarded (with the egress port it chose) go to the
//! sinks of a `[flows]` section, whose keys are the flags of `stateplane flows` written
//! with underscores (`csv = "flows.csv"`, `ipfix = ["127.0.0.1:4739"]`, `biflow = true`,
//! `inactive_timeout = 15`, ...).
//!
//! Live ports name an interface instead: `[[port]] name = "left"` and `iface = "veth0"`;
//! then the run is a daemon until SIGINT/SIGTERM, and SIGHUP reloads `[program]`.

use crate::flow_export::FlowSettings;
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub workers: Option<usize>,
    pub burst: Option<usize>,
    /// Live ports: "auto" (the default), "afpacket", "afxdp" or "observe".
    pub io: Option<String>,
    /// With `io = "observe"`: each receive ring's bytes (`"64M"`).
    pub capture_buffer: Option<crate::units::CaptureBuffer>,
    pub queue_depth: Option<usize>,
    /// The memory the run may take (`"8G"`); three quarters of the machine's by default.
    pub memory_budget: Option<crate::units::MemoryBudget>,
    pub metrics: Option<String>,
    /// Where the control API listens: a Unix socket (`unix:PATH`, the default in the run
    /// directory), a TCP address, or "off".
    pub control: Option<String>,
    /// TLS for a TCP control endpoint: the server's certificate chain and key (PEM).
    pub control_cert: Option<PathBuf>,
    pub control_key: Option<PathBuf>,
    /// Clients of a TLS control endpoint present a certificate this CA signed.
    pub control_client_ca: Option<PathBuf>,
    /// Clients of a TLS control endpoint send the token this file holds.
    pub control_token_file: Option<PathBuf>,
    /// Guarantees for the program's declared state, by name (`connections = ["replicated"]`).
    #[serde(default)]
    pub guarantees: std::collections::BTreeMap<String, Vec<String>>,
    pub program: Option<ProgramSection>,
    #[serde(default)]
    pub port: Vec<PortSection>,
    /// Flow records of what the program forwarded.
    pub flows: Option<FlowSettings>,
    /// Where `synced` state goes (`[guarantees] NAME = ["synced"]`): the collector.
    pub sync: Option<crate::sync_stage::SyncSettings>,
    /// Where `replicated` state goes (`[guarantees] NAME = ["replicated"]`): the store
    /// (the memory store when the section is left out).
    pub replication: Option<crate::replication_stage::ReplicationSettings>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ProgramSection {
    pub name: String,
    /// The program's own table, `[program.NAME]`, and nothing else.
    #[serde(flatten)]
    pub settings: toml::Table,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSection {
    pub name: String,
    pub rx: Option<PathBuf>,
    pub tx: Option<PathBuf>,
    /// A network interface: the port receives from it and sends to it (instead of files).
    pub iface: Option<String>,
}

impl RunConfig {
    /// Reads the configuration at `path`; relative paths in it are taken from its folder.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new(""));
        RunConfig::parse(&text, base).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// A configuration from its text; relative paths in it are taken from `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Self, String> {
        let cfg: RunConfig =
            toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())?;
        if let Some(p) = &cfg.program
            && let Some(other) = p.settings.keys().find(|k| **k != p.name)
        {
            return Err(format!(
                "program.{other}: the program is '{}', so its settings go in [program.{}]",
                p.name, p.name
            ));
        }
        let mut cfg = cfg;
        // Relative paths are relative to the configuration file, not to wherever it is run.
        let mut files: Vec<&mut PathBuf> = (cfg.port.iter_mut())
            .flat_map(|p| [&mut p.rx, &mut p.tx])
            .flatten()
            .collect();
        if let Some(key) = cfg.sync.as_mut().and_then(|s| s.key_file.as_mut()) {
            files.push(key);
        }
        files.extend(
            [
                &mut cfg.control_cert,
                &mut cfg.control_key,
                &mut cfg.control_client_ca,
                &mut cfg.control_token_file,
            ]
            .into_iter()
            .flatten(),
        );
        if let Some(f) = &mut cfg.flows {
            files.extend([&mut f.csv, &mut f.json].into_iter().flatten());
            files.extend(f.ipfix_file.iter_mut());
            files.extend(f.ipfix_spool.iter_mut());
        }
        for file in files {
            // `-` is standard output.
            if file.is_relative() && file.as_os_str() != "-" {
                *file = base.join(&*file);
            }
        }
        // So are the files a program's settings name (keys ending in `_file`).
        for (_, table) in cfg.program.iter_mut().flat_map(|p| p.settings.iter_mut()) {
            if let toml::Value::Table(t) = table {
                for (key, value) in t.iter_mut() {
                    if let toml::Value::String(file) = value
                        && key.ends_with("_file")
                        && Path::new(file.as_str()).is_relative()
                    {
                        *file = base.join(&*file).display().to_string();
                    }
                }
            }
        }
        Ok(cfg)
    }
}
