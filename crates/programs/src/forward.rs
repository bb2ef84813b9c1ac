//! `forward`: sends every packet out of the port mapped to the one it came in on.
//!
//! State: none beyond the port map. Configuration: `map`, a table from input port to output
//! port (by name or number); by default port 0 goes to 1 and 1 to 0. Counters: drops for
//! `no_mapping` (a packet on a port with no entry in the map).

use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, DropReason, PortId, Program, Verdict};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardConfig {
    #[serde(default)]
    pub map: BTreeMap<String, String>,
}

const NO_MAPPING: DropReason = DropReason::program(0);

#[derive(Debug, Clone)]
pub struct Forward {
    /// Output port per input port.
    out: Vec<Option<PortId>>,
}

impl Forward {
    pub fn new(cfg: &ForwardConfig, ports: &PortNames, field: &str) -> Result<Self, ConfigError> {
        let mut out = vec![None; ports.0.len().max(2)];
        if cfg.map.is_empty() {
            out[0] = Some(1);
            out[1] = Some(0);
        }
        for (from, to) in &cfg.map {
            let f = ports.resolve(&format!("{field}.map"), from)?;
            let t = ports.resolve(&format!("{field}.map.{from}"), to)?;
            out[usize::from(f)] = Some(t);
        }
        Ok(Forward { out })
    }

    /// A map from a list of (in, out) port numbers, for tests and benchmarks.
    pub fn from_pairs(pairs: &[(PortId, PortId)]) -> Self {
        let n = pairs
            .iter()
            .map(|&(a, b)| a.max(b))
            .max()
            .map_or(0, |m| usize::from(m) + 1);
        let mut out = vec![None; n];
        for &(a, b) in pairs {
            out[usize::from(a)] = Some(b);
        }
        Forward { out }
    }
}

impl Program for Forward {
    type Prepared = ();

    #[inline]
    fn process(&mut self, burst: &mut Burst, _ctx: &mut Context) {
        for d in burst.descs_mut() {
            d.verdict = match self.out.get(usize::from(d.in_port)) {
                Some(Some(port)) => Verdict::Forward(*port),
                _ => Verdict::Drop(NO_MAPPING),
            };
        }
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &["no_mapping"]
    }
}
