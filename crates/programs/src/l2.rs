//! `l2`: Ethernet switching by a static MAC table.
//!
//! State: a table from (VLAN, destination MAC) to output port, fixed at configuration and
//! read-only on the fast path (read-centric). Configuration: `macs`, a list of
//! `{ mac, port, vlan }` (vlan 0 or absent: untagged); `unknown`, what to do with a
//! destination the table lacks, and with broadcast and multicast: `"drop"` (default),
//! `"flood"` (every port but the one it came in on), or a port. A packet whose destination
//! is the port it came in on is dropped (`same_port`). Counters: drops for
//! `unknown_destination` and `same_port`.

use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, DropReason, PortId, Program, Verdict};
use stateplane_wire::MacAddr;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MacEntry {
    pub mac: String,
    pub port: String,
    #[serde(default)]
    pub vlan: u16,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct L2Config {
    #[serde(default)]
    pub macs: Vec<MacEntry>,
    #[serde(default)]
    pub unknown: Option<String>,
}

const UNKNOWN_DESTINATION: DropReason = DropReason::program(0);
const SAME_PORT: DropReason = DropReason::program(1);

/// A fixed-size open-addressing table from `vlan << 48 | mac` to a port: small enough to
/// stay in cache, probed linearly, never resized after construction.
#[derive(Debug, Clone)]
pub struct MacTable {
    /// Key + 1 (0 marks an empty slot), and the port.
    slots: Vec<(u64, PortId)>,
    mask: usize,
}

impl MacTable {
    pub fn new(entries: &[(u64, PortId)]) -> Self {
        let size = (entries.len() * 2).next_power_of_two().max(16);
        let mut table = MacTable {
            slots: vec![(0, 0); size],
            mask: size - 1,
        };
        for &(key, port) in entries {
            let mut i = Self::slot(key) & table.mask;
            while table.slots[i].0 != 0 && table.slots[i].0 != key + 1 {
                i = (i + 1) & table.mask;
            }
            table.slots[i] = (key + 1, port);
        }
        table
    }

    #[inline(always)]
    fn slot(key: u64) -> usize {
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<PortId> {
        let mut i = Self::slot(key) & self.mask;
        loop {
            let (k, port) = self.slots[i];
            if k == key + 1 {
                return Some(port);
            }
            if k == 0 {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }
}

pub(crate) fn table_key(vlan: u16, mac: [u8; 6]) -> u64 {
    u64::from(vlan & 0x0fff) << 48 | MacAddr(mac).to_u64()
}

/// What happens to a frame whose destination the table does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unknown {
    Drop,
    Flood,
    Port(PortId),
}

#[derive(Debug, Clone)]
pub struct L2 {
    table: MacTable,
    unknown: Unknown,
}

impl L2 {
    pub fn new(cfg: &L2Config, ports: &PortNames, field: &str) -> Result<Self, ConfigError> {
        let mut entries = Vec::new();
        for (i, e) in cfg.macs.iter().enumerate() {
            let f = format!("{field}.macs[{i}]");
            let mac: MacAddr = e
                .mac
                .parse()
                .map_err(|err| ConfigError::new(format!("{f}.mac"), format!("{err}")))?;
            if e.vlan > 4095 {
                return Err(ConfigError::new(
                    format!("{f}.vlan"),
                    "a VLAN id is 0 to 4095",
                ));
            }
            entries.push((
                table_key(e.vlan, mac.0),
                ports.resolve(&format!("{f}.port"), &e.port)?,
            ));
        }
        let unknown = match cfg.unknown.as_deref() {
            None | Some("drop") => Unknown::Drop,
            Some("flood") => Unknown::Flood,
            Some(p) => Unknown::Port(ports.resolve(&format!("{field}.unknown"), p)?),
        };
        Ok(L2 {
            table: MacTable::new(&entries),
            unknown,
        })
    }
}

impl Program for L2 {
    #[inline]
    fn process(&mut self, burst: &mut Burst, _ctx: &mut Context) {
        for p in burst.iter_mut() {
            let mut dst = [0u8; 6];
            dst.copy_from_slice(&p.data[..6]);
            let vlan = p.desc.parsed.key.vlan;
            let known = if dst[0] & 1 == 0 {
                self.table.get(table_key(vlan, dst))
            } else {
                None
            };
            let port = match (known, self.unknown) {
                (Some(port), _) | (None, Unknown::Port(port)) => Some(port),
                (None, Unknown::Flood) => {
                    p.desc.verdict = Verdict::Flood;
                    continue;
                }
                (None, Unknown::Drop) => None,
            };
            p.desc.verdict = match port {
                Some(port) if port == p.desc.in_port => Verdict::Drop(SAME_PORT),
                Some(port) => Verdict::Forward(port),
                None => Verdict::Drop(UNKNOWN_DESTINATION),
            };
        }
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &["unknown_destination", "same_port"]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports() -> PortNames {
        PortNames(vec!["a".into(), "b".into(), "c".into()])
    }

    #[test]
    fn table_finds_every_entry_and_nothing_else() {
        let entries: Vec<(u64, PortId)> = (0..500u64)
            .map(|i| (i * 7919 + 1, (i % 3) as PortId))
            .collect();
        let t = MacTable::new(&entries);
        for &(k, p) in &entries {
            assert_eq!(t.get(k), Some(p));
        }
        assert_eq!(t.get(2), None);
    }

    #[test]
    fn switches_by_mac_and_vlan() {
        let cfg: L2Config = toml::from_str(
            r#"
            unknown = "c"
            macs = [ { mac = "02:00:00:00:00:01", port = "a" },
                     { mac = "02:00:00:00:00:02", port = "b" },
                     { mac = "02:00:00:00:00:02", port = "a", vlan = 7 } ]
            "#,
        )
        .unwrap();
        let mut l2 = L2::new(&cfg, &ports(), "program.l2").unwrap();
        let frame = |dst: u8, vlan: Option<u16>| {
            let mut f = vec![2, 0, 0, 0, 0, dst, 2, 0, 0, 0, 0, 9];
            if let Some(v) = vlan {
                f.extend_from_slice(&[0x81, 0, (v >> 8) as u8, v as u8]);
            }
            f.extend_from_slice(&[0x88, 0xb5]);
            f.resize(60, 0);
            f
        };
        let (a, b, c, d) = (
            frame(2, None),
            frame(2, Some(7)),
            frame(1, None),
            frame(5, None),
        );
        let burst = crate::testutil::run_on(&mut l2, &[(&a, 2), (&b, 2), (&c, 0), (&d, 0)], 3);
        assert_eq!(
            crate::testutil::verdicts(&burst),
            [
                Verdict::Forward(1),
                Verdict::Forward(0),
                Verdict::Drop(SAME_PORT),
                Verdict::Forward(2)
            ]
        );
    }

    #[test]
    fn unknown_destinations_and_broadcasts_flood_when_asked() {
        let cfg: L2Config = toml::from_str(
            r#"
            unknown = "flood"
            macs = [ { mac = "02:00:00:00:00:01", port = "a" } ]
            "#,
        )
        .unwrap();
        let mut l2 = L2::new(&cfg, &ports(), "program.l2").unwrap();
        let frames: Vec<Vec<u8>> = [[0xff; 6], [2, 0, 0, 0, 0, 7], [2, 0, 0, 0, 0, 1]]
            .iter()
            .map(|dst| {
                let mut f = dst.to_vec();
                f.extend_from_slice(&[2, 0, 0, 0, 0, 9, 0x88, 0xb5]);
                f.resize(60, 0);
                f
            })
            .collect();
        let on_port_2: Vec<(&[u8], PortId)> = frames.iter().map(|f| (f.as_slice(), 2)).collect();
        let burst = crate::testutil::run_on(&mut l2, &on_port_2, 3);
        assert_eq!(
            crate::testutil::verdicts(&burst),
            [Verdict::Flood, Verdict::Flood, Verdict::Forward(0)]
        );
    }

    #[test]
    fn config_errors_name_the_field() {
        let bad_mac: L2Config =
            toml::from_str(r#"macs = [ { mac = "02:00", port = "a" } ]"#).unwrap();
        let e = L2::new(&bad_mac, &ports(), "program.l2").unwrap_err();
        assert_eq!(e.field, "program.l2.macs[0].mac");
        let bad_port: L2Config =
            toml::from_str(r#"macs = [ { mac = "02:00:00:00:00:01", port = "z" } ]"#).unwrap();
        let e = L2::new(&bad_port, &ports(), "program.l2").unwrap_err();
        assert!(
            e.to_string()
                .contains("program.l2.macs[0].port: there is no port 'z'; the ports are: a, b, c"),
            "{e}"
        );
        let unknown_field = toml::from_str::<toml::Value>("mac_table = 1").unwrap();
        let e = crate::build("l2", Some(&unknown_field), &ports())
            .err()
            .unwrap();
        assert!(e.to_string().contains("mac_table"), "{e}");
    }
}
