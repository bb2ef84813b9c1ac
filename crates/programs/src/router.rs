//! `router`: IPv4 and IPv6 forwarding by longest-prefix match, with next-hop rewriting.
//!
//! For each packet: look the destination up in the LPM table of its IP version; no route
//! drops (`no_route`); a TTL or hop limit of 1 or less drops (`ttl_expired`); otherwise the
//! TTL is decremented (the IPv4 header checksum updated incrementally, RFC 1624), the
//! destination MAC becomes the next hop's and the source MAC the output port's, and the
//! packet leaves by the route's port. ARP and other non-IP frames go to the control plane
//! (`ToControl(1)`), which answers for the router.
//!
//! State: two LPM tables, `routes4` and `routes6` in the control API (read-centric: the
//! data plane only reads them, shared by every worker). A route change from the control
//! plane makes the next version of the tables on the control plane's thread, in the spare
//! of a left-right pair (only the entries the prefix covers are rewritten), and each worker
//! swaps to it between two bursts, so a lookup never waits for an update. Configuration: `routes`, a list of
//! `{ prefix = "198.19.0.0/16", port = PORT, next_hop_mac = "02:..." }` (IPv4 or IPv6
//! prefixes); `port_macs`, each port's own MAC (`{ PORT = "02:..." }`; default
//! 02:00:00:00:00:NN for port NN-1).

use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_mem::budget::{Allowance, Growth};
use stateplane_runtime::{Burst, Context, DropReason, PortId, Program, Verdict};
use stateplane_state::control::{Action, Field, Format, MatchKind, page};
use stateplane_state::{
    ControlError, Declaration, Entry, Guarantee, Kind, Lpm4, Lpm6, Match, Reply, Request, Write,
};
use stateplane_wire::MacAddr;
use stateplane_wire::{Parsed, edit};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteEntry {
    pub prefix: String,
    pub port: String,
    pub next_hop_mac: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    #[serde(default)]
    pub routes: Vec<RouteEntry>,
    #[serde(default)]
    pub port_macs: BTreeMap<String, String>,
}

/// Where a route leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextHop {
    pub port: PortId,
    pub mac: [u8; 6],
}

const NO_ROUTE: DropReason = DropReason::program(0);
const TTL_EXPIRED: DropReason = DropReason::program(1);
/// `ToControl` code for frames the router's control plane answers (ARP, neighbour
/// discovery).
pub const TO_CONTROL_NOT_ROUTED: u16 = 1;

/// The tables, shared read-only by every worker.
#[derive(Clone)]
pub struct Tables {
    v4: Lpm4<NextHop>,
    v6: Lpm6<NextHop>,
}

#[derive(Clone)]
pub struct Router {
    tables: Arc<Tables>,
    /// The newest tables and a spare, shared by every instance: the control plane's
    /// instance makes the next tables from them, which the workers then take.
    versions: Arc<Mutex<Versions>>,
    port_macs: Vec<[u8; 6]>,
}

/// Route tables in the control API: key the destination prefix; action `route(port, mac)`.
fn route_table(name: &str, bits: u8, format: Format, ports: usize) -> Declaration {
    Declaration {
        name: name.to_string(),
        capacity: 1 << 24,
        guarantees: vec![Guarantee::Local],
        kind: Kind::Table {
            key: vec![Field::new("dst", bits, format, MatchKind::Lpm)],
            actions: vec![Action {
                name: "route".into(),
                params: vec![
                    Field::port("port", ports),
                    Field::exact("mac", 48, Format::Mac),
                ],
            }],
            writable: true,
        },
    }
}

fn route_entry(addr: u128, len: u8, hop: &NextHop) -> Entry {
    Entry {
        key: vec![Match::Prefix { value: addr, len }],
        action: "route".into(),
        params: vec![u128::from(hop.port), u128::from(MacAddr(hop.mac).to_u64())],
        priority: 0,
        hits: 0,
    }
}

/// The prefix of a checked key (one LPM field).
fn prefix_of(key: &[Match]) -> (u128, u8) {
    match key.first() {
        Some(Match::Prefix { value, len }) => (*value, *len),
        _ => (0, 0),
    }
}

/// Route tables by version, kept as a left-right pair: the workers read `newest`; once they
/// have all moved on from the version before it (`spare`), the next version is made by
/// bringing the spare up to date (`behind`: the writes it lacks) and applying the new
/// writes to it, in place. Each write then costs its painted ranges, twice, instead of a
/// copy of the whole tables (which is the fallback while a worker still holds the spare).
///
/// The pair's bytes, twice the newest tables', are held from the run's memory budget:
/// writes that would take more than it has left are refused. (The copy made while a worker
/// still holds the spare lives only until that worker moves on, and is not counted.)
struct Versions {
    newest: Arc<Tables>,
    spare: Option<Arc<Tables>>,
    behind: Vec<(bool, Write)>,
    budget: Allowance,
}

impl Versions {
    /// The tables after `writes` (each for the IPv4 table or not), now the newest; nothing
    /// changes if one is refused.
    fn next(
        &mut self,
        writes: &[(bool, Write)],
        ports: usize,
    ) -> Result<Arc<Tables>, ControlError> {
        let reusable = self.spare.take().and_then(|mut spare| {
            let tables = Arc::get_mut(&mut spare)?;
            for (v4, w) in &self.behind {
                // Checked when they first came: they apply again.
                let _ = tables.apply(*v4, w, "", ports);
            }
            Some(spare)
        });
        let mut next = reusable.unwrap_or_else(|| Arc::new(Tables::clone(&self.newest)));
        let Some(tables) = Arc::get_mut(&mut next) else {
            return Err(ControlError::Unavailable);
        };
        let name = |v4: bool| if v4 { "routes4" } else { "routes6" };
        for (v4, w) in writes {
            // On a refusal the half-updated tables are dropped; the next write copies.
            tables.apply(*v4, w, name(*v4), ports)?;
        }
        if let Err(e) = self
            .budget
            .cover(|| tables.what_pair_takes(), tables.pair_bytes(), 0)
        {
            return Err(ControlError::OverBudget {
                table: name(writes.first().is_none_or(|w| w.0)).into(),
                why: e.to_string(),
            });
        }
        let before = std::mem::replace(&mut self.newest, next.clone());
        self.spare = Some(before);
        self.behind = writes.to_vec();
        Ok(next)
    }
}

impl Tables {
    /// What the left-right pair of tables like these takes.
    fn pair_bytes(&self) -> u64 {
        2 * (self.v4.memory() + self.v6.memory()) as u64
    }

    fn what_pair_takes(&self) -> String {
        format!(
            "two versions of route tables with {} IPv4 and {} IPv6 prefixes",
            self.v4.len(),
            self.v6.len()
        )
    }

    /// The next hop of exactly this prefix, in the IPv4 (`v4`) or IPv6 table.
    fn get(&self, v4: bool, addr: u128, len: u8) -> Option<&NextHop> {
        if v4 {
            self.v4.get(Ipv4Addr::from(addr as u32), len)
        } else {
            self.v6.get(Ipv6Addr::from(addr), len)
        }
    }

    /// Applies one checked write for the IPv4 (`v4`) or IPv6 table.
    fn apply(
        &mut self,
        v4: bool,
        w: &Write,
        table: &str,
        ports: usize,
    ) -> Result<(), ControlError> {
        let key = match w {
            Write::Insert(e) | Write::Modify(e) => &e.key,
            Write::Delete(k) => k,
        };
        let (addr, len) = prefix_of(key);
        let (a4, a6) = (Ipv4Addr::from(addr as u32), Ipv6Addr::from(addr));
        let present = self.get(v4, addr, len).is_some();
        let refused = match (w, present) {
            (Write::Insert(_), true) => Some(ControlError::Exists {
                table: table.into(),
            }),
            (Write::Modify(_) | Write::Delete(_), false) => Some(ControlError::NoSuchEntry {
                table: table.into(),
            }),
            _ => None,
        };
        if let Some(e) = refused {
            return Err(e);
        }
        let (Write::Insert(e) | Write::Modify(e)) = w else {
            if v4 {
                self.v4.remove(a4, len);
            } else {
                self.v6.remove(a6, len);
            }
            return Ok(());
        };
        let port = e.params.first().copied().unwrap_or(0);
        if port >= ports as u128 {
            return Err(ControlError::OutOfRange {
                name: "port".into(),
                index: port as usize,
                size: ports,
            });
        }
        let mac = e.params.get(1).copied().unwrap_or(0) as u64;
        let hop = NextHop {
            port: port as PortId,
            mac: MacAddr::from_u64(mac).0,
        };
        let added = if v4 {
            self.v4.insert(a4, len, hop)
        } else {
            self.v6.insert(a6, len, hop)
        };
        added.map_err(|_| ControlError::TableFull {
            table: table.into(),
            capacity: 1 << 24,
        })
    }
}

pub(crate) fn parse_mac(field: &str, text: &str) -> Result<[u8; 6], ConfigError> {
    text.parse::<MacAddr>().map(|m| m.0).map_err(|_| {
        ConfigError::new(
            field,
            format!("'{text}' is not a MAC address like 02:00:00:00:00:01"),
        )
    })
}

impl Router {
    pub fn new(cfg: &RouterConfig, ports: &PortNames, field: &str) -> Result<Self, ConfigError> {
        let mut port_macs: Vec<[u8; 6]> = (0..ports.0.len())
            .map(|i| [0x02, 0, 0, 0, 0, (i + 1) as u8])
            .collect();
        for (port, mac) in &cfg.port_macs {
            let f = format!("{field}.port_macs.{port}");
            let p = ports.resolve(&f, port)?;
            port_macs[usize::from(p)] = parse_mac(&f, mac)?;
        }
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for (i, r) in cfg.routes.iter().enumerate() {
            let f = format!("{field}.routes[{i}]");
            let hop = NextHop {
                port: ports.resolve(&format!("{f}.port"), &r.port)?,
                mac: parse_mac(&format!("{f}.next_hop_mac"), &r.next_hop_mac)?,
            };
            match crate::parse_prefix(&format!("{f}.prefix"), &r.prefix)? {
                (IpAddr::V4(a), len) => v4.push((a, len, hop)),
                (IpAddr::V6(a), len) => v6.push((a, len, hop)),
            }
        }
        let router = Router::from_routes(&v4, &v6, port_macs)
            .map_err(|e| ConfigError::new(format!("{field}.routes"), e.to_string()))?;
        {
            let mut versions = router
                .versions
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let Versions { newest, budget, .. } = &mut *versions;
            budget
                .cover(|| newest.what_pair_takes(), newest.pair_bytes(), 0)
                .map_err(|e| ConfigError::new(format!("{field}.routes"), e.to_string()))?;
        }
        Ok(router)
    }

    /// A router from route lists (benchmarks, large generated tables) and each port's MAC.
    pub fn from_routes(
        v4: &[(std::net::Ipv4Addr, u8, NextHop)],
        v6: &[(std::net::Ipv6Addr, u8, NextHop)],
        port_macs: Vec<[u8; 6]>,
    ) -> Result<Self, stateplane_state::PrefixError> {
        let tables = Arc::new(Tables {
            v4: Lpm4::build(v4)?,
            v6: Lpm6::build(v6)?,
        });
        Ok(Router {
            versions: Arc::new(Mutex::new(Versions {
                newest: tables.clone(),
                spare: None,
                behind: Vec::new(),
                budget: Allowance::new(Growth::of_scope(), "routes"),
            })),
            tables,
            port_macs,
        })
    }

    /// Routes one packet in place; its verdict.
    fn route(&self, data: &mut [u8], parsed: &Parsed) -> Verdict {
        let dst = &parsed.key.dst;
        let hop = match parsed.key.ip_version {
            4 => {
                let a = u32::from_be_bytes([dst[0], dst[1], dst[2], dst[3]]);
                self.tables.v4.lookup(a)
            }
            _ => self.tables.v6.lookup(&std::net::Ipv6Addr::from(*dst)),
        };
        let Some(hop) = hop.copied() else {
            return Verdict::Drop(NO_ROUTE);
        };
        if edit::dec_ttl(data, parsed).is_err() {
            return Verdict::Drop(TTL_EXPIRED);
        }
        data[..6].copy_from_slice(&hop.mac);
        data[6..12].copy_from_slice(&self.port_macs[usize::from(hop.port)]);
        Verdict::Forward(hop.port)
    }
}

impl Program for Router {
    /// The next tables, made by a write.
    type Prepared = Tables;

    fn process(&mut self, burst: &mut Burst, _ctx: &mut Context) {
        for p in burst.iter_mut() {
            let d = p.desc;
            let key = d.parsed.key;
            let l3 = usize::from(d.parsed.l3_offset);
            d.verdict = if key.ip_version == 0 || l3 == 0 {
                Verdict::ToControl(TO_CONTROL_NOT_ROUTED)
            } else {
                self.route(p.data, &d.parsed)
            };
        }
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &["no_route", "ttl_expired"]
    }

    fn declarations(&self) -> Vec<Declaration> {
        vec![
            route_table("routes4", 32, Format::Ipv4, self.port_macs.len()),
            route_table("routes6", 128, Format::Ipv6, self.port_macs.len()),
        ]
    }

    /// A write makes the next tables here, on the control plane's thread; a refused write
    /// leaves the newest tables as they were.
    fn prepare(&self, request: &Request) -> Result<Option<Arc<Tables>>, ControlError> {
        let Request::Write { table, writes } = request else {
            return Ok(None);
        };
        let mut versions = self.versions.lock().unwrap_or_else(PoisonError::into_inner);
        let writes: Vec<(bool, Write)> = writes
            .iter()
            .map(|w| (table == "routes4", w.clone()))
            .collect();
        let next = versions.next(&writes, self.port_macs.len())?;
        Ok(Some(next))
    }

    fn control(
        &mut self,
        request: &Request,
        prepared: Option<&Arc<Tables>>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        match request {
            Request::Write { .. } => {
                self.tables = prepared.cloned().ok_or(ControlError::Unavailable)?;
                Ok(Reply::Done)
            }
            Request::Read { table, key, from } => {
                let v4 = table == "routes4";
                if let Some(key) = key {
                    let (a, len) = prefix_of(key);
                    let hop =
                        self.tables
                            .get(v4, a, len)
                            .ok_or_else(|| ControlError::NoSuchEntry {
                                table: table.clone(),
                            })?;
                    return Ok(Reply::Page(vec![route_entry(a, len, hop)], None));
                }
                // The tables are shared: one worker reads them.
                if ctx.worker != 0 {
                    return Ok(Reply::Page(Vec::new(), None));
                }
                let t = &self.tables;
                let (entries, next) = if v4 {
                    let all =
                        t.v4.iter()
                            .map(|(a, l, h)| (u128::from(u32::from(a)), l, h));
                    page(all, *from, t.v4.len())
                } else {
                    let all = t.v6.iter().map(|(a, l, h)| (u128::from(a), l, h));
                    page(all, *from, t.v6.len())
                };
                let entries = entries
                    .into_iter()
                    .map(|(a, len, hop)| route_entry(a, len, hop))
                    .collect();
                Ok(Reply::Page(entries, next))
            }
            // The tables are shared: one worker counts them.
            Request::Stats { table } if ctx.worker == 0 => {
                let n = if table == "routes4" {
                    self.tables.v4.len()
                } else {
                    self.tables.v6.len()
                };
                Ok(Reply::Counters(vec![("prefixes", n as u64)]))
            }
            Request::Stats { .. } => Ok(Reply::Counters(Vec::new())),
            _ => Err(ControlError::Unavailable),
        }
    }

    crate::configured_state!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_wire::ipv4::Ipv4Packet;

    /// Route writes made through the left-right pair (the spare brought up to date, or a
    /// copy while a worker still holds it) give the tables a rebuild from the surviving
    /// routes gives, after every write, refused ones included.
    #[test]
    fn left_right_versions_match_a_rebuild_after_every_write() {
        let r = router();
        let hop = |port: u16| NextHop {
            port,
            mac: [2, 0, 0, 0, 0, port as u8],
        };
        // The fixture's IPv4 routes.
        let mut routes: Vec<(u32, u8, NextHop)> = vec![
            (
                0xc613_0000,
                16,
                NextHop {
                    port: 1,
                    mac: [2, 0, 0, 0, 0x0b, 1],
                },
            ),
            (
                0xc613_0700,
                24,
                NextHop {
                    port: 2,
                    mac: [2, 0, 0, 0, 0x0c, 1],
                },
            ),
        ];
        let mut held: Vec<Arc<Tables>> = Vec::new(); // what "workers" still hold
        let mut x = 7u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..120 {
            let len = 16 + (rnd() % 13) as u8;
            let addr = (0xc613_0000 | (rnd() as u32 & 0xffff)) & (u32::MAX << (32 - len));
            let at = routes.iter().position(|&(a, l, _)| (a, l) == (addr, len));
            let port = (rnd() % 3) as u16;
            let entry = route_entry(u128::from(addr), len, &hop(port));
            let write = match (rnd() % 3, at) {
                (0, Some(_)) => Write::Delete(entry.key),
                (1, Some(_)) => Write::Modify(entry),
                _ => Write::Insert(entry),
            };
            let request = Request::Write {
                table: "routes4".into(),
                writes: vec![write.clone()],
            };
            match (r.prepare(&request), &write, at) {
                (Ok(Some(p)), _, _) => {
                    let t = p;
                    match (&write, at) {
                        (Write::Insert(_), None) => routes.push((addr, len, hop(port))),
                        (Write::Modify(_), Some(i)) => routes[i].2 = hop(port),
                        (Write::Delete(_), Some(i)) => {
                            routes.remove(i);
                        }
                        _ => panic!("step {step}: {write:?} was taken"),
                    }
                    // Workers move on at different times: sometimes one lags a version.
                    if rnd() % 4 != 0 {
                        held.clear();
                    }
                    held.push(t);
                }
                (Err(ControlError::Exists { .. }), Write::Insert(_), Some(_)) => {}
                (other, _, _) => panic!("step {step}: {write:?} gave {:?}", other.map(|_| ())),
            }
            let newest = held.last().unwrap();
            let list: Vec<_> = routes
                .iter()
                .map(|&(a, l, h)| (Ipv4Addr::from(a), l, h))
                .collect();
            let rebuilt = Lpm4::build(&list).unwrap();
            for _ in 0..64 {
                let a = 0xc613_0000 | (rnd() as u32 & 0xffff);
                assert_eq!(
                    newest.v4.lookup(a),
                    rebuilt.lookup(a),
                    "step {step}, {a:#x}"
                );
            }
        }
    }

    /// Route writes take the run's memory budget as they grow the tables (both versions
    /// of the pair): past it a write is refused, saying so, and changes nothing, while a
    /// write that needs no more room is still taken; a budget too small for the
    /// configured routes refuses the run, naming them.
    #[test]
    fn route_writes_past_the_memory_budget_are_refused_and_change_nothing() {
        use stateplane_mem::budget::scope;
        let budget = |limit| crate::testutil::budget(limit, 3);
        let (_, at_load) = scope(budget(u64::MAX), router);
        assert!(at_load.bytes > 2 * (64 << 20), "{}", at_load.bytes);
        let (r, _) = scope(budget(at_load.bytes + (64 << 10)), router);
        let hop = NextHop {
            port: 1,
            mac: [2, 0, 0, 0, 0, 1],
        };
        let insert = |r: &Router, i: u32| {
            // A /32 in a /24 of its own: a second-level group each.
            let addr = 0xc612_0001 + (i << 8);
            let write = Write::Insert(route_entry(u128::from(addr), 32, &hop));
            r.prepare(&Request::Write {
                table: "routes4".into(),
                writes: vec![write],
            })
        };
        let mut written = 0;
        let refusal = loop {
            match insert(&r, written) {
                Ok(_) => written += 1,
                Err(e) => break e,
            }
            assert!(written < 1_000, "never refused");
        };
        assert!(written >= 10, "{written}");
        assert!(matches!(refusal, ControlError::OverBudget { .. }));
        let message = refusal.to_string();
        assert!(
            message.starts_with("table `routes4`: two versions of route tables with")
                && message.contains("past the memory budget")
                && message.ends_with("nothing was written"),
            "{message}"
        );
        let newest = r.versions.lock().unwrap().newest.clone();
        assert_eq!(
            newest.v4.len(),
            2 + written as usize,
            "the refused route is not there"
        );
        // A route changed in place needs no more room.
        let modify = Write::Modify(route_entry(
            u128::from(0xc612_0001u32),
            32,
            &NextHop { port: 2, ..hop },
        ));
        let request = Request::Write {
            table: "routes4".into(),
            writes: vec![modify],
        };
        assert!(r.prepare(&request).is_ok());
        let names = PortNames(vec!["a".into(), "b".into(), "c".into()]);
        let cfg: RouterConfig = toml::from_str(
            r#"routes = [{ prefix = "198.19.0.0/16", port = "b", next_hop_mac = "02:00:00:00:0b:01" }]"#,
        )
        .unwrap();
        let (refused, _) = scope(budget(64 << 20), || {
            Router::new(&cfg, &names, "program.router")
        });
        let e = refused.err().unwrap();
        assert_eq!(e.field, "program.router.routes");
        assert!(
            e.to_string().contains("past the memory budget of 64.0 MiB"),
            "{e}"
        );
    }

    fn router() -> Router {
        let names = PortNames(vec!["a".into(), "b".into(), "c".into()]);
        let cfg: RouterConfig = toml::from_str(
            r#"
            routes = [
              { prefix = "198.19.0.0/16", port = "b", next_hop_mac = "02:00:00:00:0b:01" },
              { prefix = "198.19.7.0/24", port = "c", next_hop_mac = "02:00:00:00:0c:01" },
              { prefix = "2001:2::/32", port = "c", next_hop_mac = "02:00:00:00:0c:06" },
            ]
            port_macs = { b = "02:00:00:00:00:bb" }
            "#,
        )
        .unwrap();
        Router::new(&cfg, &names, "program.router").unwrap()
    }

    fn frame(dst: &str, ttl: u8) -> Vec<u8> {
        crate::testutil::udp_frame(dst, ttl)
    }

    fn run(r: &mut Router, frames: &[Vec<u8>]) -> Burst {
        crate::testutil::run(r, frames, 3)
    }

    #[test]
    fn routes_by_longest_prefix_and_rewrites_the_packet() {
        let mut r = router();
        let b = run(
            &mut r,
            &[
                frame("198.19.1.1", 64),
                frame("198.19.7.9", 64),
                frame("198.20.0.1", 64),
                frame("198.19.1.1", 1),
                frame("2001:2:5::1", 9),
            ],
        );
        let v: Vec<Verdict> = b.descs().iter().map(|d| d.verdict).collect();
        assert_eq!(
            v,
            [
                Verdict::Forward(1),
                Verdict::Forward(2),
                Verdict::Drop(NO_ROUTE),
                Verdict::Drop(TTL_EXPIRED),
                Verdict::Forward(2),
            ]
        );
        // The first packet: next hop's MAC, port b's own MAC, TTL 63, checksum still valid.
        let out = b.data(0);
        assert_eq!(&out[..6], &[2, 0, 0, 0, 0x0b, 1]);
        assert_eq!(&out[6..12], &[2, 0, 0, 0, 0, 0xbb]);
        let ip = Ipv4Packet::new_checked(&out[14..]).unwrap();
        assert_eq!(ip.ttl(), 63);
        assert!(
            ip.verify_checksum(),
            "incremental update keeps the header checksum valid"
        );
        // Port c has the default MAC 02:00:00:00:00:03; IPv6 hop limit 9 -> 8.
        assert_eq!(&b.data(4)[6..12], &[2, 0, 0, 0, 0, 3]);
        assert_eq!(b.data(4)[14 + 7], 8);
    }

    #[test]
    fn arp_goes_to_the_control_plane_and_bad_routes_name_the_field() {
        let mut r = router();
        let mut arp = frame("198.19.1.1", 64);
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        arp.truncate(42);
        let b = run(&mut r, &[arp]);
        assert_eq!(
            b.descs()[0].verdict,
            Verdict::ToControl(TO_CONTROL_NOT_ROUTED)
        );
        let names = PortNames(vec!["a".into()]);
        let cfg: RouterConfig = toml::from_str(
            r#"routes = [{ prefix = "198.19.0.0/33", port = "a", next_hop_mac = "02:00:00:00:00:01" }]"#,
        )
        .unwrap();
        let e = Router::new(&cfg, &names, "program.router").err().unwrap();
        assert_eq!(e.field, "program.router.routes[0].prefix");
    }
}
