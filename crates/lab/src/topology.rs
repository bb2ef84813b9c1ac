//! The topology file: hosts, switches, links, and an optional controller, checked before
//! anything is created.
//!
//! ```toml
//! name = "line"                       # namespaces are sp-line-h1, sp-line-s1, ...
//! [[host]]
//! name = "h1"
//! [[switch]]
//! name = "s1"
//! workers = 1
//! [switch.program]                    # as in `stateplane run --config`
//! name = "forward"
//! [[link]]
//! a = { node = "h1", iface = "eth0", addr = "198.18.0.1/24", mac = "02:00:00:00:01:01" }
//! b = { node = "s1", iface = "p0" }   # switch ports are in link order
//!                                     # (an end may set `mtu = 1280`: its interface's)
//! [controller]                        # a host on a management network with every switch
//! name = "c1"
//! ```

use serde::Deserialize;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::Path;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub name: String,
    #[serde(default)]
    pub host: Vec<Host>,
    #[serde(default)]
    pub switch: Vec<Switch>,
    #[serde(default)]
    pub link: Vec<Link>,
    pub controller: Option<Controller>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub name: String,
    /// Extra routes, as `ip route add` takes them ("198.19.0.0/16 via 198.18.0.254").
    #[serde(default)]
    pub routes: Vec<String>,
    /// Static neighbor (ARP) entries: for addresses nobody answers ARP for, such as the
    /// external address of a `nat` running as a bump in the wire.
    #[serde(default)]
    pub neighbors: Vec<Neighbor>,
    /// Whether the host forwards IPv4 between its links (a router; it then also sends
    /// the ICMP errors a router sends, such as fragmentation needed).
    #[serde(default)]
    pub forwarding: bool,
}

/// `{ addr = "198.18.0.100", mac = "02:00:00:00:01:01", iface = "eth0" }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Neighbor {
    pub addr: String,
    pub mac: String,
    pub iface: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Switch {
    pub name: String,
    pub workers: Option<usize>,
    /// How the switch reads and writes its ports: "auto", "afpacket" or "afxdp".
    pub io: Option<String>,
    /// The `[program]` table of the switch's `stateplane run` configuration.
    pub program: toml::Table,
    /// Its `[guarantees]` and `[sync]` tables (state synced to a collector, e.g. on the
    /// controller: `collector = "198.19.255.1:7474"`).
    pub guarantees: Option<toml::Table>,
    pub sync: Option<toml::Table>,
    /// Its `[replication]` table (replicated state, e.g. to the controller's Redis:
    /// `store = "redis://198.19.255.1:6379/"`).
    pub replication: Option<toml::Table>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    pub a: End,
    pub b: End,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct End {
    pub node: String,
    pub iface: String,
    /// An IPv4 address with prefix length, in 198.18.0.0/15 (hosts only).
    pub addr: Option<String>,
    pub mac: Option<String>,
    /// The interface's MTU (68 to 65535; default the kernel's 1500). The two ends of a
    /// link may differ: a router's smaller one makes it refuse larger packets with
    /// "fragmentation needed", as a path with a small MTU does.
    pub mtu: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Controller {
    pub name: String,
    /// The management subnet (a /24 in 198.18.0.0/15): the controller is .1, switches
    /// .2 upwards in file order.
    #[serde(default = "default_mgmt")]
    pub subnet: String,
    /// A redis-server on the controller, at its management address and this port, started
    /// before the switches (the store of their replicated state).
    pub redis: Option<u16>,
}

fn default_mgmt() -> String {
    "198.19.255.0/24".into()
}

/// What kind of node a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Host,
    Switch,
    Controller,
}

/// The longest lab and node names: a namespace is `sp-LAB-NODE`, and the controller's
/// management ports are `m-NODE` (interface names have at most 15 bytes).
pub const MAX_NAME: usize = 12;

impl Topology {
    pub fn load(path: &Path) -> Result<Topology, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let t: Topology = toml::from_str(&text)
            .map_err(|e| format!("{}: {}", path.display(), e.to_string().trim_end()))?;
        t.check().map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(t)
    }

    pub fn kind(&self, node: &str) -> Option<Kind> {
        if self.host.iter().any(|h| h.name == node) {
            Some(Kind::Host)
        } else if self.switch.iter().any(|s| s.name == node) {
            Some(Kind::Switch)
        } else if self.controller.as_ref().is_some_and(|c| c.name == node) {
            Some(Kind::Controller)
        } else {
            None
        }
    }

    /// Every node name, hosts first, then switches, then the controller.
    pub fn nodes(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.host.iter().map(|h| h.name.as_str()).collect();
        v.extend(self.switch.iter().map(|s| s.name.as_str()));
        v.extend(self.controller.iter().map(|c| c.name.as_str()));
        v
    }

    /// The network namespace of `node`.
    pub fn namespace(&self, node: &str) -> String {
        namespace(&self.name, node)
    }

    /// The ports of switch `name`, in link order.
    pub fn switch_ports(&self, name: &str) -> Vec<&str> {
        self.link
            .iter()
            .flat_map(|l| [&l.a, &l.b])
            .filter(|e| e.node == name)
            .map(|e| e.iface.as_str())
            .collect()
    }

    /// The management addresses: the controller's, then each switch's, with the prefix.
    pub fn management(&self) -> Result<Option<(String, Vec<String>)>, String> {
        let Some(c) = &self.controller else {
            return Ok(None);
        };
        let (net, len) = parse_cidr(&c.subnet).map_err(|e| format!("controller.subnet: {e}"))?;
        if len != 24 {
            return Err("controller.subnet: give a /24".into());
        }
        let base = u32::from(net) & 0xffff_ff00;
        let addr = |i: u32| format!("{}/24", Ipv4Addr::from(base + i));
        Ok(Some((
            addr(1),
            (0..self.switch.len() as u32).map(|i| addr(i + 2)).collect(),
        )))
    }

    /// Checks names, references and addresses; the error names the field.
    pub fn check(&self) -> Result<(), String> {
        check_name("name", &self.name)?;
        let mut seen = BTreeSet::new();
        for (i, n) in self.nodes().iter().enumerate() {
            check_name(&format!("node {i}"), n)?;
            if !seen.insert(*n) {
                return Err(format!("node '{n}' is defined twice; names must be unique"));
            }
        }
        let mut ifaces = BTreeSet::new();
        for (i, l) in self.link.iter().enumerate() {
            for (side, e) in [("a", &l.a), ("b", &l.b)] {
                let field = format!("link[{i}].{side}");
                match self.kind(&e.node) {
                    None => {
                        return Err(format!(
                            "{field}.node: there is no node '{}'; the nodes are: {}",
                            e.node,
                            self.nodes().join(", ")
                        ));
                    }
                    Some(Kind::Switch) if e.addr.is_some() => {
                        return Err(format!(
                            "{field}.addr: switch ports carry no address; put it on the host"
                        ));
                    }
                    _ => {}
                }
                if e.iface.is_empty() || e.iface.len() > 15 || e.iface.contains(['/', ' ', ':']) {
                    return Err(format!(
                        "{field}.iface: '{}' is not an interface name (1-15 characters, no '/', ':' or spaces)",
                        e.iface
                    ));
                }
                if !ifaces.insert((e.node.clone(), e.iface.clone())) {
                    return Err(format!(
                        "{field}.iface: {}:{} is used by two links",
                        e.node, e.iface
                    ));
                }
                if let Some(a) = &e.addr {
                    let (ip, _) = parse_cidr(a).map_err(|m| format!("{field}.addr: {m}"))?;
                    check_lab_address(ip).map_err(|m| format!("{field}.addr: {m}"))?;
                }
                if let Some(m) = &e.mac {
                    check_mac(m).map_err(|m| format!("{field}.mac: {m}"))?;
                }
                if let Some(mtu) = e.mtu
                    && !(68..=65_535).contains(&mtu)
                {
                    return Err(format!(
                        "{field}.mtu: {mtu} is not an IPv4 MTU; give 68 to 65535"
                    ));
                }
            }
        }
        for h in &self.host {
            for (i, n) in h.neighbors.iter().enumerate() {
                let field = format!("host '{}' neighbors[{i}]", h.name);
                let ip: Ipv4Addr = (n.addr.parse())
                    .map_err(|_| format!("{field}.addr: '{}' is not an IPv4 address", n.addr))?;
                check_lab_address(ip).map_err(|m| format!("{field}.addr: {m}"))?;
                check_mac(&n.mac).map_err(|m| format!("{field}.mac: {m}"))?;
                if !ifaces.contains(&(h.name.clone(), n.iface.clone())) {
                    return Err(format!(
                        "{field}.iface: host '{}' has no link on '{}'",
                        h.name, n.iface
                    ));
                }
            }
        }
        for s in &self.switch {
            if self.switch_ports(&s.name).is_empty() {
                return Err(format!("switch '{}' has no links", s.name));
            }
            if !s.program.contains_key("name") {
                return Err(format!(
                    "switch '{}': program.name is missing (e.g. name = \"forward\")",
                    s.name
                ));
            }
        }
        if let Some(c) = &self.controller {
            let (ip, _) = parse_cidr(&c.subnet).map_err(|m| format!("controller.subnet: {m}"))?;
            check_lab_address(ip).map_err(|m| format!("controller.subnet: {m}"))?;
            self.management()?;
        }
        Ok(())
    }
}

pub fn namespace(lab: &str, node: &str) -> String {
    format!("sp-{lab}-{node}")
}

fn check_name(field: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.as_bytes()[0].is_ascii_lowercase();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{field}: '{name}' is not a valid name: 1-{MAX_NAME} lowercase letters and digits, starting with a letter"
        ))
    }
}

/// `a.b.c.d/len` as address and prefix length.
pub fn parse_cidr(text: &str) -> Result<(Ipv4Addr, u8), String> {
    let (ip, len) = text
        .split_once('/')
        .ok_or_else(|| format!("'{text}' has no prefix length; write it like 198.18.0.1/24"))?;
    let ip: Ipv4Addr = ip
        .parse()
        .map_err(|_| format!("'{ip}' is not an IPv4 address"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| (8..=30).contains(l))
        .ok_or_else(|| format!("'/{len}' is not a prefix length from /8 to /30"))?;
    Ok((ip, len))
}

/// Lab addresses come from the benchmarking range 198.18.0.0/15 (RFC 2544), never used
/// on the Internet, so nothing in a lab can reach or impersonate a real host.
fn check_lab_address(ip: Ipv4Addr) -> Result<(), String> {
    let o = ip.octets();
    if o[0] == 198 && (o[1] == 18 || o[1] == 19) {
        Ok(())
    } else {
        Err(format!(
            "{ip} is outside 198.18.0.0/15; lab addresses come from that benchmarking range only"
        ))
    }
}

fn check_mac(text: &str) -> Result<(), String> {
    let parts: Vec<&str> = text.split(':').collect();
    let ok = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && u8::from_str_radix(p, 16).is_ok());
    let unicast = parts
        .first()
        .and_then(|p| u8::from_str_radix(p, 16).ok())
        .is_some_and(|b| b & 1 == 0);
    if ok && unicast {
        Ok(())
    } else {
        Err(format!(
            "'{text}' is not a unicast MAC address like 02:00:00:00:01:01"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(text: &str) -> Result<Topology, String> {
        let t: Topology = toml::from_str(text).map_err(|e| e.to_string())?;
        t.check()?;
        Ok(t)
    }

    const LINE: &str = r#"
        name = "line"
        [[host]]
        name = "h1"
        [[host]]
        name = "h2"
        [[switch]]
        name = "s1"
        [switch.program]
        name = "forward"
        [[link]]
        a = { node = "h1", iface = "eth0", addr = "198.18.0.1/24" }
        b = { node = "s1", iface = "p0" }
        [[link]]
        a = { node = "s1", iface = "p1" }
        b = { node = "h2", iface = "eth0", addr = "198.18.0.2/24" }
        [controller]
        name = "c1"
    "#;

    #[test]
    fn the_shipped_topologies_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topologies");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "toml") {
                Topology::load(&path).unwrap();
                n += 1;
            }
        }
        assert!(n >= 3, "line, dual and more are shipped");
    }

    #[test]
    fn ports_follow_link_order_and_management_addresses_are_assigned() {
        let t = topo(LINE).unwrap();
        assert_eq!(t.switch_ports("s1"), ["p0", "p1"]);
        assert_eq!(t.namespace("s1"), "sp-line-s1");
        let (c, s) = t.management().unwrap().unwrap();
        assert_eq!(c, "198.19.255.1/24");
        assert_eq!(s, ["198.19.255.2/24"]);
    }

    #[test]
    fn mistakes_name_the_field() {
        let cases = [
            (
                LINE.replace("198.18.0.2/24", "10.0.0.2/24"),
                "link[1].b.addr",
            ),
            (LINE.replace("198.18.0.2/24", "198.18.0.2"), "prefix length"),
            (
                LINE.replace("node = \"h2\"", "node = \"h9\""),
                "no node 'h9'",
            ),
            (
                LINE.replace("name = \"line\"", "name = \"Line\""),
                "not a valid name",
            ),
            (
                LINE.replace("iface = \"p1\"", "iface = \"p0\""),
                "used by two links",
            ),
            (
                LINE.replace(
                    "b = { node = \"s1\", iface = \"p0\" }",
                    "b = { node = \"s1\", iface = \"p0\", addr = \"198.18.0.9/24\" }",
                ),
                "switch ports carry no address",
            ),
            (
                LINE.replace(
                    "name = \"h2\"",
                    "name = \"h2\"\nneighbors = [{ addr = \"8.8.8.8\", mac = \"02:00:00:00:01:01\", iface = \"eth0\" }]",
                ),
                "neighbors[0].addr: 8.8.8.8 is outside 198.18.0.0/15",
            ),
            (
                LINE.replace(
                    "name = \"h2\"",
                    "name = \"h2\"\nneighbors = [{ addr = \"198.18.0.9\", mac = \"02:00:00:00:01:01\", iface = \"eth1\" }]",
                ),
                "host 'h2' neighbors[0].iface: host 'h2' has no link on 'eth1'",
            ),
            (
                LINE.replace("addr = \"198.18.0.2/24\"", "addr = \"198.18.0.2/24\", mtu = 67"),
                "link[1].b.mtu: 67 is not an IPv4 MTU; give 68 to 65535",
            ),
        ];
        for (text, want) in cases {
            let e = topo(&text).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
