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
use stateplane_state::control::{Action, Field, Format};
use stateplane_state::{
    Declaration, DeclaredTable, ExactCodec, ExpireProfile, Guarantee, Kind, Match, params_into,
};
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
    /// Entries the table holds at most (configured and added by the control plane).
    #[serde(default = "default_capacity")]
    pub capacity: usize,
}

fn default_capacity() -> usize {
    4096
}

const UNKNOWN_DESTINATION: DropReason = DropReason::program(0);
const SAME_PORT: DropReason = DropReason::program(1);

/// The control plane's view of a MAC table (this one's and `l2learn`'s): key `vlan`,
/// `mac`; action `forward(port)`.
pub(crate) struct StationCodec;

impl StationCodec {
    /// The table `name` of a switch with `ports` ports.
    pub(crate) fn declaration(
        name: &str,
        capacity: usize,
        writable: bool,
        ports: usize,
    ) -> Declaration {
        Declaration {
            name: name.to_string(),
            capacity,
            guarantees: vec![Guarantee::Local],
            kind: Kind::Table {
                key: vec![
                    Field::exact("vlan", 12, Format::Int),
                    Field::exact("mac", 48, Format::Mac),
                ],
                actions: vec![Action {
                    name: "forward".to_string(),
                    params: vec![Field::port("port", ports)],
                }],
                writable,
            },
        }
    }
}

impl ExactCodec for StationCodec {
    type Key = u64;
    type Value = PortId;

    fn key(fields: &[Match]) -> u64 {
        let exact = |i: usize| match fields.get(i) {
            Some(Match::Exact(v)) => *v as u64,
            _ => 0,
        };
        (exact(0) & 0x0fff) << 48 | (exact(1) & 0xffff_ffff_ffff)
    }

    fn fields(key: &u64) -> Vec<Match> {
        vec![
            Match::Exact(u128::from(key >> 48)),
            Match::Exact(u128::from(key & 0xffff_ffff_ffff)),
        ]
    }

    fn value(_action: usize, params: &[u128]) -> PortId {
        params.first().map_or(0, |&p| p as PortId)
    }

    fn action_values(port: &PortId, out: &mut [u128]) -> (usize, usize) {
        (0, params_into([u128::from(*port)], out))
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

#[derive(Clone)]
pub struct L2 {
    table: DeclaredTable<StationCodec>,
    unknown: Unknown,
}

impl L2 {
    pub fn new(
        cfg: &L2Config,
        ports: &PortNames,
        field: &str,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        if cfg.capacity == 0 || cfg.capacity > 1 << 24 || cfg.capacity < cfg.macs.len() {
            return Err(ConfigError::new(
                format!("{field}.capacity"),
                format!(
                    "give {} to 16777216 entries (at least the {} configured)",
                    cfg.macs.len().max(1),
                    cfg.macs.len()
                ),
            ));
        }
        let mut table = crate::budgeted_table(
            &format!("{field}.capacity"),
            cfg.capacity,
            &[ExpireProfile::NEVER],
            seed,
        )?;
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
            let port = ports.resolve(&format!("{f}.port"), &e.port)?;
            // A repeated (VLAN, MAC) keeps its first port, as a table insert would.
            let _ = table.add_entry(table_key(e.vlan, mac.0), port, 0, 0);
        }
        let unknown = match cfg.unknown.as_deref() {
            None | Some("drop") => Unknown::Drop,
            Some("flood") => Unknown::Flood,
            Some(p) => Unknown::Port(ports.resolve(&format!("{field}.unknown"), p)?),
        };
        Ok(L2 {
            table: DeclaredTable::new(
                table,
                StationCodec::declaration("macs", cfg.capacity, true, ports.0.len()),
            ),
            unknown,
        })
    }
}

impl Program for L2 {
    type Prepared = ();

    #[inline]
    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        for p in burst.iter_mut() {
            let mut dst = [0u8; 6];
            dst.copy_from_slice(&p.data[..6]);
            let vlan = p.desc.parsed.key.vlan;
            let known = if dst[0] & 1 == 0 {
                let id = self.table.lookup(&table_key(vlan, dst), ctx.now_ns);
                id.map(|id| *self.table.value(id))
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

    crate::answer_by_table!(table);

    crate::synced_tables::synced_table_methods!(table);

    crate::configured_state!();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports() -> PortNames {
        PortNames(vec!["a".into(), "b".into(), "c".into()])
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
        let mut l2 = L2::new(&cfg, &ports(), "program.l2", 1).unwrap();
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
        let mut l2 = L2::new(&cfg, &ports(), "program.l2", 1).unwrap();
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
        let Err(e) = L2::new(&bad_mac, &ports(), "program.l2", 1) else {
            panic!("a bad MAC is refused")
        };
        assert_eq!(e.field, "program.l2.macs[0].mac");
        let bad_port: L2Config =
            toml::from_str(r#"macs = [ { mac = "02:00:00:00:00:01", port = "z" } ]"#).unwrap();
        let Err(e) = L2::new(&bad_port, &ports(), "program.l2", 1) else {
            panic!("a bad port is refused")
        };
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
