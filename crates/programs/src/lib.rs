//! The network functions that ship with Stateplane.
//!
//! Owns: each program's logic and its configuration, and [`build`], which turns a program
//! name and its TOML table into a factory of per-worker instances.
//!
//! Must never: touch ports, threads or files (the runtime and the CLI do), or keep per-flow
//! state shared between workers (each instance owns its worker's shard of flows; `steer`
//! shares only its paths' liveness).

pub mod acl;
pub mod conntrack;
pub mod forward;
pub mod l2;
pub mod l2learn;
pub mod router;
pub mod steer;
#[cfg(test)]
mod testutil;

use stateplane_runtime::{PortId, ProgramFactory};
use stateplane_wire::{FlowHasher, FlowKey};
use std::fmt;
use std::sync::Arc;

/// The programs `build` knows, with a line about each.
pub const CATALOG: &[(&str, &str)] = &[
    (
        "acl",
        "5-tuple permit/deny list (first match wins) before forward or router",
    ),
    (
        "conntrack",
        "TCP/UDP connection tracking by add-on-miss, with per-state idle timeouts",
    ),
    ("forward", "port-to-port pass-through by a static port map"),
    ("l2", "Ethernet switching by a static MAC table"),
    (
        "l2learn",
        "Ethernet learning switch: learns by add-on-miss, floods the unknown, ages out",
    ),
    (
        "router",
        "IPv4/IPv6 forwarding by longest-prefix match, TTL and MAC rewriting",
    ),
    (
        "steer",
        "spreads flows over parallel switches and moves them off one that stops answering",
    ),
];

/// A configuration problem, naming the field and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub problem: String,
}

impl ConfigError {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

impl std::error::Error for ConfigError {}

/// The switch's port names, for resolving the names programs use in their configuration.
#[derive(Debug, Clone)]
pub struct PortNames(pub Vec<String>);

impl PortNames {
    /// A port given by name or by number.
    pub fn resolve(&self, field: &str, name: &str) -> Result<PortId, ConfigError> {
        if let Some(i) = self.0.iter().position(|n| n == name) {
            return Ok(i as PortId);
        }
        match name.parse::<usize>() {
            Ok(i) if i < self.0.len() => Ok(i as PortId),
            _ => Err(ConfigError::new(
                field,
                format!(
                    "there is no port '{name}'; the ports are: {} (by name, or by number from 0)",
                    self.0.join(", ")
                ),
            )),
        }
    }
}

/// Builds the factory of program `name` from its configuration table (`None`: defaults).
pub fn build(
    name: &str,
    config: Option<&toml::Value>,
    ports: &PortNames,
) -> Result<ProgramFactory, ConfigError> {
    let field = format!("program.{name}");
    let table = config
        .cloned()
        .unwrap_or_else(|| toml::Value::Table(Default::default()));
    let parse_error = |e: toml::de::Error| ConfigError::new(field.clone(), e.message().to_owned());
    match name {
        "forward" => {
            let cfg: forward::ForwardConfig = table.try_into().map_err(parse_error)?;
            let program = forward::Forward::new(&cfg, ports, &field)?;
            Ok(Arc::new(move |_| Box::new(program.clone())))
        }
        "l2" => {
            let cfg: l2::L2Config = table.try_into().map_err(parse_error)?;
            let program = l2::L2::new(&cfg, ports, &field)?;
            Ok(Arc::new(move |_| Box::new(program.clone())))
        }
        "acl" => {
            let cfg: acl::AclConfig = table.try_into().map_err(parse_error)?;
            let program = acl::Acl::new(&cfg, ports, &field)?;
            Ok(Arc::new(move |_| Box::new(program.clone())))
        }
        "conntrack" => {
            let cfg: conntrack::ConntrackConfig = table.try_into().map_err(parse_error)?;
            // A random table seed per process, so crafted traffic cannot aim at a bucket.
            let seed = FlowHasher::random().hash(&FlowKey::EMPTY);
            let program = conntrack::Conntrack::new(&cfg, ports, &field, seed)?;
            // Each worker starts from an empty copy of the table.
            Ok(Arc::new(move |_| Box::new(program.clone())))
        }
        "l2learn" => {
            let cfg: l2learn::L2LearnConfig = table.try_into().map_err(parse_error)?;
            let seed = FlowHasher::random().hash(&FlowKey::EMPTY);
            let program = l2learn::L2Learn::new(&cfg, ports, &field, seed)?;
            Ok(Arc::new(move |_| Box::new(program.clone())))
        }
        "router" => {
            let cfg: router::RouterConfig = table.try_into().map_err(parse_error)?;
            let program = router::Router::new(&cfg, ports, &field)?;
            // The route tables are shared read-only (an Arc); each worker holds a handle.
            Ok(Arc::new(move |_| Box::new(program.clone())))
        }
        "steer" => {
            let cfg: steer::SteerConfig = table.try_into().map_err(parse_error)?;
            let program = steer::Steer::new(&cfg, ports, &field)?;
            // One instance per worker, all sharing the paths' liveness (the atomics).
            Ok(Arc::new(move |_| Box::new(program.clone())))
        }
        other => {
            let names: Vec<&str> = CATALOG.iter().map(|(n, _)| *n).collect();
            Err(ConfigError::new(
                "program",
                format!(
                    "there is no program '{other}'; choose one of: {}",
                    names.join(", ")
                ),
            ))
        }
    }
}
