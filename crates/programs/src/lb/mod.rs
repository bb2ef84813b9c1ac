//! `lb`: a layer-4 load balancer. Clients reach virtual IPs (VIPs); each connection is
//! sent to one backend of its VIP's pool and stays with it.
//!
//! The first packet of a connection (PNA add-on-miss) picks its backend from the VIP's
//! Maglev table (consistent hashing over the backends that are up, so that a change of the
//! pool moves few connections) and adds an affinity entry, which every later packet of the
//! connection follows, whatever happens to the table since. Packets to a backend leave with
//! the backend's address and port as their destination (and its MAC, when configured), out
//! of the backend's port; the backend's answers come back with the VIP as their source.
//! Answers need no per-connection state: a backend (address, port, protocol) serves one VIP.
//!
//! Backends are the control plane's while the switch runs (the `backends` table): `ctl
//! insert` adds one to a configured VIP, `ctl modify` sets it `up`, `drain` (out of the
//! VIP's table for new connections, its own connections stay until they end) or `down`
//! (its connections move to others at their next packet, counted in `moved`) and sets its
//! weight (its share of the table), `ctl delete` removes it (as `down`, and its answers are
//! no longer taken). Every other connection stays where it is: the tables are filled
//! again, and only new connections read them.
//!
//! A VIP may hash clients instead of connections (`affinity = "client"`): every
//! connection of a client goes to one backend, for protocols that open several
//! connections that must meet (FTP, iperf3's control and data streams).
//!
//! Workers: the Maglev tables are shared and identical on every worker, and the hash they
//! are read with is fixed, so every worker (and a restarted switch) picks the same backend
//! for a connection; each worker keeps the affinity of the connections the runtime sends
//! it.
//!
//! Not balanced: non-IP frames (ARP) pass (from the clients' port to every other port,
//! from the others to the clients'); IP packets to no VIP, and from a backend's side not
//! from a backend, are dropped (`no_vip`, `not_backend`), as are later fragments.
//!
//! State: `connections` (declared; key the client's 5-tuple; write-centric: added per
//! connection, its timer and packet count updated by every packet; it may be `synced`,
//! and `replicated`: its state and backend, not its count, so that established connections
//! only read) and `backends`
//! (declared; key address, port and protocol; action `up`, `drain` or `down` with the
//! VIP, weight, port and MAC; read-centric, shared by the workers, written by the control
//! plane). Configuration: `clients` (port, default 0), `servers` (the default port of
//! backends, default 1), `vips`, `capacity` (connections per worker, default 65536),
//! `table_size` (Maglev slots per VIP, a prime, default 65537), `max_backends` (default
//! 4096), `early_drop` (default true), `timeouts` in seconds.
//!
//! A connection opened by a SYN is `tcp_new` until the client's next packet (its ACK of the
//! handshake), with a short timeout (`tcp_new`, 60 s, as IPVS's SYN_RECV). A full table
//! makes room for a new connection (with `early_drop`): an expired entry near its slot
//! gives way, else the `tcp_new` or `udp` one closest to expiry, as Linux conntrack's early
//! drop; so a SYN flood at a VIP displaces only its own kind, never an established
//! connection.

mod maglev;

use crate::keys::filled_table;
use crate::nat::rewrite;
use crate::{ConfigError, PortNames, parse_ipv4, router::parse_mac};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, DropReason, PacketDesc, PortId, Program, Verdict};
use stateplane_state::control::{Action, Entry, Field, Format, MatchKind, Write, page};
use stateplane_state::{
    Carried, ControlError, Declaration, DeclaredTable, ExactTable, ExpireProfile, Guarantee, Kind,
    Match, Notification, Reply, Request, ValueCodec, params_into,
};
use stateplane_wire::edit::Side;
use stateplane_wire::parse::ParseFlags;
use stateplane_wire::tcp::flags;
use stateplane_wire::{FlowHasher, FlowKey};
use std::sync::{Arc, Mutex, PoisonError};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LbConfig {
    #[serde(default = "default_clients")]
    pub clients: String,
    #[serde(default = "default_servers")]
    pub servers: String,
    pub vips: Vec<VipConfig>,
    #[serde(default = "default_capacity")]
    pub capacity: usize,
    #[serde(default = "default_table_size")]
    pub table_size: usize,
    /// How many backends the run may have had in all, those the control plane inserts
    /// and deletes included.
    #[serde(default = "default_max_backends")]
    pub max_backends: usize,
    /// A full table drops an unestablished connection to make room for a new one.
    #[serde(default = "crate::default_true")]
    pub early_drop: bool,
    #[serde(default)]
    pub timeouts: Timeouts,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VipConfig {
    pub address: String,
    pub port: u16,
    /// "tcp" (the default) or "udp".
    #[serde(default = "default_proto")]
    pub proto: String,
    /// "connection" (the default): each connection is hashed; "client": each client.
    #[serde(default = "default_affinity")]
    pub affinity: String,
    pub backends: Vec<BackendConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub address: String,
    /// The backend's port; the VIP's by default.
    pub port: Option<u16>,
    /// The switch port it is reached by; `servers` by default.
    pub via: Option<String>,
    /// The MAC address to send to; unchanged by default.
    pub mac: Option<String>,
    /// Its share of new connections against the VIP's other backends (1 to 256).
    #[serde(default = "default_weight")]
    pub weight: u16,
}

fn default_clients() -> String {
    "0".into()
}

fn default_servers() -> String {
    "1".into()
}

fn default_proto() -> String {
    "tcp".into()
}

fn default_affinity() -> String {
    "connection".into()
}

fn default_capacity() -> usize {
    65_536
}

fn default_table_size() -> usize {
    65_537
}

fn default_max_backends() -> usize {
    4096
}

fn default_weight() -> u16 {
    1
}

/// Idle timeouts of affinity entries, in seconds (those of Linux IPVS).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    pub tcp: f64,
    /// After a FIN from the client.
    pub tcp_closing: f64,
    pub udp: f64,
    /// After the client's SYN, until its next packet.
    pub tcp_new: f64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            tcp: 900.0,
            tcp_closing: 120.0,
            udp: 300.0,
            tcp_new: 60.0,
        }
    }
}

const TCP: u8 = 6;
const UDP: u8 = 17;

/// The hash connections are read from the Maglev tables with: fixed, so that every worker
/// and every restart of the switch agrees.
const HASH_SEED: u64 = 0x4c42_4d41_474c_4556;

/// A connection's affinity: what the data plane keeps per connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct Affinity {
    /// 0 TCP, 1 TCP closing, 2 UDP, 3 TCP opened by a SYN and not yet acknowledged: also
    /// the index of its expiry profile.
    pub state: u8,
    /// The backend, by its place in the configuration (VIP by VIP), which is also its
    /// place in `ctl read backends`.
    pub backend: u16,
    pub packets: u32,
}

const STATES: [&str; 4] = ["tcp", "tcp_closing", "udp", "tcp_new"];
const ESTABLISHED: u8 = 0;
const CLOSING: u8 = 1;
const UDP_STATE: u8 = 2;
const NEW: u8 = 3;

struct AffinityCodec;

impl AffinityCodec {
    fn declaration(capacity: usize) -> Declaration {
        let params = vec![
            Field::exact("backend", 16, Format::Int),
            Field::exact("packets", 32, Format::Int),
        ];
        filled_table::<FlowKey>("connections", "", capacity, &STATES, params)
    }
}

impl ValueCodec for AffinityCodec {
    type Key = FlowKey;
    type Value = Affinity;

    fn value(action: usize, params: &[u128]) -> Affinity {
        let p = |i: usize| params.get(i).copied().unwrap_or(0);
        Affinity {
            state: action.min(STATES.len() - 1) as u8,
            backend: p(0) as u16,
            packets: p(1) as u32,
        }
    }

    const COUNTING: &'static [&'static str] = &["packets"];

    fn action_values(a: &Affinity, out: &mut [u128]) -> (usize, usize) {
        let params = [u128::from(a.backend), u128::from(a.packets)];
        (usize::from(a.state), params_into(params, out))
    }
}

const NO_VIP: DropReason = DropReason::program(0);
const NO_BACKEND: DropReason = DropReason::program(1);
const TABLE_FULL: DropReason = DropReason::program(2);
const NOT_BACKEND: DropReason = DropReason::program(3);
const FRAGMENT: DropReason = DropReason::program(4);
const TRUNCATED: DropReason = DropReason::program(5);

/// What a backend takes. Its place in `Pools::backends` outlives it: an affinity names a
/// backend by place, so a place is never given to another backend while the switch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BackendState {
    /// New connections (its share of the Maglev table) and its own.
    Up,
    /// Its own connections only: out of the Maglev table, so that it empties as they end.
    Drain,
    /// Nothing: its connections move to the others at their next packet.
    Down,
    /// Deleted through the control plane: as `Down`, and no longer read or answered for.
    Removed,
}

/// The `backends` table's actions, by `BackendState` (`Removed` is no action).
const BACKEND_STATES: [&str; 3] = ["up", "drain", "down"];

/// The heaviest weight a backend may have (HAProxy's bound): enough for any ratio an
/// operator sets, light enough that the lightest backend keeps slots in a 65537-slot table.
const MAX_WEIGHT: u16 = 256;

#[derive(Debug, Clone)]
struct Backend {
    address: [u8; 4],
    port: u16,
    proto: u8,
    via: PortId,
    mac: Option<[u8; 6]>,
    vip: u16,
    weight: u16,
    state: BackendState,
}

impl Backend {
    /// What Maglev knows it by: its address and port, not its place in the configuration.
    fn identity(&self) -> u64 {
        endpoint(self.address, self.port, self.proto)
    }

    /// Whether a connection of VIP `vip` that has this backend stays with it.
    #[inline]
    fn keeps(&self, vip: u16) -> bool {
        matches!(self.state, BackendState::Up | BackendState::Drain) && self.vip == vip
    }
}

#[derive(Debug, Clone)]
struct Vip {
    address: [u8; 4],
    port: u16,
    by_client: bool,
    /// The Maglev table over its backends that are up (empty: none is).
    table: Arc<Vec<u16>>,
}

/// An (address, port, protocol) as one table key.
fn endpoint(address: [u8; 4], port: u16, proto: u8) -> u64 {
    u64::from(u32::from_be_bytes(address)) << 24 | u64::from(port) << 8 | u64::from(proto)
}

/// The pools, shared read-only by every worker and replaced whole when the control plane
/// changes a backend.
#[derive(Clone)]
pub struct Pools {
    vips: Vec<Vip>,
    /// Every backend the run has had, by place (see `BackendState`).
    backends: Vec<Backend>,
    /// VIP endpoint -> VIP index.
    vip_of: ExactTable<u64, u16>,
    /// Backend endpoint -> backend index, for the backends not removed.
    backend_of: ExactTable<u64, u16>,
    table_size: usize,
    /// How many places `backends` may take (`max_backends`).
    max_backends: usize,
    clients: PortId,
}

impl Pools {
    /// Fills VIP `v`'s Maglev table from its backends that are up.
    fn fill(&mut self, v: usize) {
        let members: Vec<maglev::Member> = (self.backends.iter().enumerate())
            .filter(|(_, b)| usize::from(b.vip) == v && b.state == BackendState::Up)
            .map(|(index, b)| maglev::Member {
                index: index as u16,
                identity: b.identity(),
                weight: b.weight,
            })
            .collect();
        self.vips[v].table = Arc::new(maglev::populate(&members, self.table_size));
    }

    /// The backend `hash` picks among VIP `v`'s backends that are up.
    #[inline]
    fn pick(&self, v: usize, hash: u64) -> Option<u16> {
        let table = &self.vips[v].table;
        (!table.is_empty()).then(|| table[(hash % table.len() as u64) as usize])
    }

    /// Applies the control plane's writes to `backends`, in order: an insert adds a backend
    /// to a configured VIP, a modify sets its state, weight, port or MAC, a delete removes
    /// it. The caller keeps the pools from before when one is refused.
    fn apply(&mut self, writes: &[Write]) -> Result<(), ControlError> {
        let mut changed = Vec::new();
        for w in writes {
            let v = match w {
                Write::Insert(entry) => self.insert(entry)?,
                Write::Modify(entry) => self.modify(entry)?,
                Write::Delete(key) => self.remove(key)?,
            };
            changed.push(v);
        }
        changed.sort_unstable();
        changed.dedup();
        for v in changed {
            self.fill(usize::from(v));
        }
        Ok(())
    }

    /// Adds the backend `entry` describes; returns its VIP.
    fn insert(&mut self, entry: &Entry) -> Result<u16, ControlError> {
        let backend = self.backend(entry)?;
        let (key, vip) = (backend.identity(), backend.vip);
        if self.backend_of.get(&key).is_some() {
            return Err(ControlError::Exists {
                table: "backends".into(),
            });
        }
        // A backend deleted and inserted again takes back its place (and the connections
        // still naming it); any other takes a new one.
        let place = match (self.backends.iter()).position(|b| b.identity() == key) {
            Some(place) => {
                self.backends[place] = backend;
                place
            }
            None if self.backends.len() < self.max_backends => {
                self.backends.push(backend);
                self.backends.len() - 1
            }
            None => {
                return Err(invalid(format!(
                    "the run has given all {} backend places (max_backends), deleted \
                     backends' included, as a place is never given to another backend while \
                     connections may name it; raise max_backends (a reload starts again \
                     from the configuration's backends)",
                    self.max_backends
                )));
            }
        };
        if self.backend_of.add_entry(key, place as u16, 0, 0).is_err() {
            return Err(ControlError::TableFull {
                table: "backends".into(),
                capacity: self.max_backends,
            });
        }
        Ok(vip)
    }

    /// Changes the backend `entry` names; returns its VIP.
    fn modify(&mut self, entry: &Entry) -> Result<u16, ControlError> {
        let b = self.place(&entry.key)?;
        let changed = self.backend(entry)?;
        if changed.vip != self.backends[b].vip {
            return Err(invalid(
                "a backend serves one VIP while it is there (answers tell their VIP by their \
                 backend); delete it and insert it with the other VIP"
                    .to_string(),
            ));
        }
        self.backends[b] = changed;
        Ok(self.backends[b].vip)
    }

    /// Removes the backend `key` names; returns its VIP.
    fn remove(&mut self, key: &[Match]) -> Result<u16, ControlError> {
        let b = self.place(key)?;
        let backend = &mut self.backends[b];
        backend.state = BackendState::Removed;
        self.backend_of.delete(&backend.identity());
        Ok(backend.vip)
    }

    /// The place of the backend (not removed) with the checked `backends` key `key`.
    fn place(&self, key: &[Match]) -> Result<usize, ControlError> {
        let (address, port, proto) = backend_key(key);
        (self.backend_of.get(&endpoint(address, port, proto)))
            .map(|&b| usize::from(b))
            .ok_or(ControlError::NoSuchEntry {
                table: "backends".into(),
            })
    }

    /// The backend a checked `backends` entry describes, its VIP found among the
    /// configuration's.
    fn backend(&self, entry: &Entry) -> Result<Backend, ControlError> {
        let (address, port, proto) = backend_key(&entry.key);
        let p = |i: usize| entry.params.get(i).copied().unwrap_or(0);
        let state = match (BACKEND_STATES.iter()).position(|&s| s == entry.action) {
            Some(0) => BackendState::Up,
            Some(1) => BackendState::Drain,
            _ => BackendState::Down,
        };
        let (vip_address, vip_port) = ((p(0) as u32).to_be_bytes(), p(1) as u16);
        let vip = (self.vip_of)
            .get(&endpoint(vip_address, vip_port, proto))
            .copied()
            .ok_or_else(|| {
                invalid(format!(
                    "{}:{vip_port} (proto {proto}) is not a VIP of the configuration; a \
                     backend joins one of its VIPs (VIPs are not added at run time)",
                    std::net::Ipv4Addr::from(vip_address),
                ))
            })?;
        let weight = p(2) as u16;
        if weight == 0 || weight > MAX_WEIGHT {
            return Err(invalid(format!(
                "weight {} is not from 1 to {MAX_WEIGHT}; `drain` stops new connections \
                 (IPVS's weight 0)",
                p(2)
            )));
        }
        let via = p(3) as PortId;
        if via == self.clients {
            return Err(invalid(
                "a backend must be reached by a port other than the clients' port (via)"
                    .to_string(),
            ));
        }
        let mac = (p(4) != 0).then(|| {
            let bytes = (p(4) as u64).to_be_bytes();
            [bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7]]
        });
        Ok(Backend {
            address,
            port,
            proto,
            via,
            mac,
            vip,
            weight,
            state,
        })
    }

    fn entry(&self, b: &Backend) -> Entry {
        let vip = &self.vips[usize::from(b.vip)];
        let mac = b.mac.map_or(0, |m| {
            m.iter()
                .fold(0u128, |value, &byte| value << 8 | u128::from(byte))
        });
        Entry {
            key: vec![
                Match::Exact(u128::from(u32::from_be_bytes(b.address))),
                Match::Exact(u128::from(b.port)),
                Match::Exact(u128::from(b.proto)),
            ],
            action: BACKEND_STATES[match b.state {
                BackendState::Up => 0,
                BackendState::Drain => 1,
                BackendState::Down | BackendState::Removed => 2,
            }]
            .into(),
            params: vec![
                u128::from(u32::from_be_bytes(vip.address)),
                u128::from(vip.port),
                u128::from(b.weight),
                u128::from(b.via),
                mac,
            ],
            priority: 0,
            hits: 0,
        }
    }

    /// The backends the control plane reads: those not removed.
    fn present(&self) -> impl Iterator<Item = &Backend> {
        (self.backends.iter()).filter(|b| b.state != BackendState::Removed)
    }
}

fn invalid(why: String) -> ControlError {
    ControlError::Invalid {
        what: "backends".into(),
        why,
    }
}

/// The address, port and protocol of a checked `backends` key.
fn backend_key(key: &[Match]) -> ([u8; 4], u16, u8) {
    let v = |i: usize| match key.get(i) {
        Some(Match::Exact(v)) => *v,
        _ => 0,
    };
    ((v(0) as u32).to_be_bytes(), v(1) as u16, v(2) as u8)
}

fn backends_declaration(capacity: usize, ports: usize) -> Declaration {
    let params = vec![
        Field::new("vip", 32, Format::Ipv4, MatchKind::Exact),
        Field::exact("vip_port", 16, Format::Int),
        Field::exact("weight", 16, Format::Int),
        Field::port("via", ports),
        Field::exact("mac", 48, Format::Mac),
    ];
    let state = |name: &&str| Action {
        name: name.to_string(),
        params: params.clone(),
    };
    Declaration {
        name: "backends".into(),
        capacity,
        guarantees: vec![Guarantee::Local],
        kind: Kind::Table {
            key: vec![
                Field::new("address", 32, Format::Ipv4, MatchKind::Exact),
                Field::exact("port", 16, Format::Int),
                Field::exact("proto", 8, Format::Int),
            ],
            actions: BACKEND_STATES.iter().map(state).collect(),
            writable: true,
        },
    }
}

#[derive(Clone)]
pub struct Lb {
    clients: PortId,
    pools: Arc<Pools>,
    /// The newest pools, shared by every instance: the control plane's instance makes the
    /// next from it, which the workers then take.
    newest: Arc<Mutex<Arc<Pools>>>,
    hasher: FlowHasher,
    connections: DeclaredTable<AffinityCodec>,
    /// The switch's port count (what `backends.via` may name).
    ports: usize,
    /// Connections added, and those moved off a backend that went down.
    pub created: u64,
    pub moved: u64,
}

impl Lb {
    pub fn new(
        cfg: &LbConfig,
        ports: &PortNames,
        field: &str,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        let clients = ports.resolve(&format!("{field}.clients"), &cfg.clients)?;
        let servers = ports.resolve(&format!("{field}.servers"), &cfg.servers)?;
        crate::check_capacity(&format!("{field}.capacity"), cfg.capacity, "connections")?;
        if !maglev::is_prime(cfg.table_size) || cfg.table_size > 16_777_213 {
            return Err(ConfigError::new(
                format!("{field}.table_size"),
                format!(
                    "{} is not a prime up to 16777213; Maglev tables need a prime number of \
                     slots, such as 251, 65537 or 655373 (about 100 per backend or more)",
                    cfg.table_size
                ),
            ));
        }
        if cfg.vips.is_empty() {
            return Err(ConfigError::new(
                format!("{field}.vips"),
                "give at least one VIP: [[program.lb.vips]] with address, port and backends",
            ));
        }
        let configured: usize = cfg.vips.iter().map(|v| v.backends.len()).sum();
        if cfg.max_backends < configured.max(1) || cfg.max_backends > usize::from(u16::MAX) {
            return Err(ConfigError::new(
                format!("{field}.max_backends"),
                format!(
                    "{} is not from the {configured} backends configured to 65535",
                    cfg.max_backends
                ),
            ));
        }
        let mut pools = Pools {
            vips: Vec::new(),
            backends: Vec::new(),
            vip_of: ExactTable::new(cfg.vips.len(), &[ExpireProfile::NEVER], seed),
            backend_of: ExactTable::new(
                cfg.max_backends,
                &[ExpireProfile::NEVER],
                seed.rotate_left(11),
            ),
            table_size: cfg.table_size,
            max_backends: cfg.max_backends,
            clients,
        };
        for (v, vip) in cfg.vips.iter().enumerate() {
            let at = format!("{field}.vips[{v}]");
            let address = parse_ipv4(&format!("{at}.address"), &vip.address)?;
            let proto = match vip.proto.as_str() {
                "tcp" => TCP,
                "udp" => UDP,
                other => {
                    return Err(ConfigError::new(
                        format!("{at}.proto"),
                        format!("'{other}' is not tcp or udp"),
                    ));
                }
            };
            let by_client = match vip.affinity.as_str() {
                "connection" => false,
                "client" => true,
                other => {
                    return Err(ConfigError::new(
                        format!("{at}.affinity"),
                        format!("'{other}' is not connection or client"),
                    ));
                }
            };
            if vip.backends.is_empty() {
                return Err(ConfigError::new(
                    format!("{at}.backends"),
                    "give at least one backend, like { address = \"198.18.1.1\" }",
                ));
            }
            if pools
                .vip_of
                .get(&endpoint(address, vip.port, proto))
                .is_some()
            {
                return Err(ConfigError::new(
                    at.to_string(),
                    format!(
                        "{}:{} {} is already a VIP",
                        vip.address, vip.port, vip.proto
                    ),
                ));
            }
            let _ = pools
                .vip_of
                .add_entry(endpoint(address, vip.port, proto), v as u16, 0, 0);
            for (i, b) in vip.backends.iter().enumerate() {
                let at = format!("{at}.backends[{i}]");
                let index = pools.backends.len();
                if index >= usize::from(u16::MAX) {
                    return Err(ConfigError::new(at, "at most 65535 backends in all"));
                }
                let backend = Backend {
                    address: parse_ipv4(&format!("{at}.address"), &b.address)?,
                    port: b.port.unwrap_or(vip.port),
                    proto,
                    via: match &b.via {
                        Some(port) => ports.resolve(&format!("{at}.via"), port)?,
                        None => servers,
                    },
                    mac: match &b.mac {
                        Some(mac) => Some(parse_mac(&format!("{at}.mac"), mac)?),
                        None => None,
                    },
                    vip: v as u16,
                    weight: b.weight,
                    state: BackendState::Up,
                };
                if b.weight == 0 || b.weight > MAX_WEIGHT {
                    return Err(ConfigError::new(
                        format!("{at}.weight"),
                        format!("{} is not from 1 to {MAX_WEIGHT}", b.weight),
                    ));
                }
                if backend.via == clients {
                    return Err(ConfigError::new(
                        format!("{at}.via"),
                        "a backend must be reached by a port other than the clients' port",
                    ));
                }
                let key = endpoint(backend.address, backend.port, proto);
                if pools.backend_of.get(&key).is_some() {
                    return Err(ConfigError::new(
                        at.to_string(),
                        format!(
                            "{}:{} {} already serves a VIP; answers could not tell which \
                             VIP to come from (give it another port)",
                            b.address, backend.port, vip.proto
                        ),
                    ));
                }
                let _ = pools.backend_of.add_entry(key, index as u16, 0, 0);
                pools.backends.push(backend);
            }
            pools.vips.push(Vip {
                address,
                port: vip.port,
                by_client,
                table: Arc::new(Vec::new()),
            });
            pools.fill(v);
        }
        let t = &cfg.timeouts;
        // By `Affinity::state`.
        let profiles = crate::idle_profiles(
            &format!("{field}.timeouts"),
            &[
                ("tcp", t.tcp),
                ("tcp_closing", t.tcp_closing),
                ("udp", t.udp),
                ("tcp_new", t.tcp_new),
            ],
        )?;
        let mut connections = crate::budgeted_table(
            &format!("{field}.capacity"),
            cfg.capacity,
            &profiles,
            seed.rotate_left(23),
        )?;
        if cfg.early_drop {
            connections.set_early_drop(&[NEW, UDP_STATE]);
        }
        let pools = Arc::new(pools);
        Ok(Lb {
            clients,
            newest: Arc::new(Mutex::new(pools.clone())),
            pools,
            hasher: FlowHasher::with_seed(HASH_SEED),
            connections: DeclaredTable::new(connections, AffinityCodec::declaration(cfg.capacity)),
            ports: ports.0.len(),
            created: 0,
            moved: 0,
        })
    }

    /// The affinity of the client connection `key` (as a packet from the client has it).
    pub fn affinity_of(&self, key: &FlowKey) -> Option<Affinity> {
        self.connections
            .get(&FlowKey { in_port: 0, ..*key })
            .copied()
    }

    pub fn len(&self) -> usize {
        self.connections.len()
    }

    pub fn is_empty(&self) -> bool {
        self.connections.is_empty()
    }

    /// The connection of a client's packet to a VIP, as the table keys it: its replicated
    /// key. Answers from backends keep no state (`None`).
    fn connection_of(&self, packet: &PacketDesc, _data: &[u8]) -> Option<FlowKey> {
        let key = FlowKey {
            in_port: 0,
            ..packet.parsed.key
        };
        let to_vip = key.ip_version == 4
            && matches!(key.proto, TCP | UDP)
            && (self.pools.vip_of)
                .get(&endpoint(
                    [key.dst[0], key.dst[1], key.dst[2], key.dst[3]],
                    key.dst_port,
                    key.proto,
                ))
                .is_some();
        (packet.in_port == self.clients && to_vip).then_some(key)
    }

    /// A packet from a client: to the backend of its connection.
    fn toward_backend(&mut self, data: &mut [u8], d: &mut PacketDesc) -> Verdict {
        let parsed = &d.parsed;
        if parsed.key.ip_version == 0 {
            return Verdict::Flood;
        }
        let key = FlowKey {
            in_port: 0,
            ..parsed.key
        };
        let pools = &*self.pools;
        let vip = match (key.ip_version, key.proto) {
            (4, TCP | UDP) => {
                let dst = [key.dst[0], key.dst[1], key.dst[2], key.dst[3]];
                pools.vip_of.get(&endpoint(dst, key.dst_port, key.proto))
            }
            _ => None,
        };
        let Some(&vip) = vip else {
            return Verdict::Drop(NO_VIP);
        };
        if parsed.flags.has(ParseFlags::LATER_FRAGMENT) {
            return Verdict::Drop(FRAGMENT);
        }
        let v = usize::from(vip);
        let now = d.ts_ns;
        let tcp_flags = if key.proto == TCP {
            parsed.tcp_flags
        } else {
            0
        };
        // A connection not marked leased waits for the replication stage (checked only
        // where its table checks leases).
        let Ok(found) = self.connections.lookup_leased(&key, now, d.lease_check) else {
            return Verdict::Drop(DropReason::NOT_LEASED);
        };
        let backend = match found {
            Some(id) => {
                let a = *self.connections.value(id);
                let mut backend = a.backend;
                // An affinity installed from elsewhere (a replica, a synced write) may name
                // a place this configuration does not have: it picks again.
                let kept = pools.backends.get(usize::from(backend));
                if !kept.is_some_and(|b| b.keeps(vip)) {
                    let Some(other) = pools.pick(v, self.connection_hash(v, &key)) else {
                        return Verdict::Drop(NO_BACKEND);
                    };
                    backend = other;
                    self.moved += 1;
                }
                let closing = a.state == CLOSING || tcp_flags & flags::FIN != 0;
                // The client's first packet after its SYN establishes the connection.
                let state = if closing {
                    CLOSING
                } else if a.state == NEW && tcp_flags & flags::SYN == 0 {
                    ESTABLISHED
                } else {
                    a.state
                };
                *self.connections.value_mut(id) = Affinity {
                    state,
                    backend,
                    packets: a.packets.saturating_add(1),
                };
                if tcp_flags & flags::RST != 0 {
                    self.connections.delete(&key);
                } else if state != a.state {
                    let _ = self.connections.set_profile(id, state, now);
                } else if !closing {
                    self.connections.restart_timer(id, now);
                }
                backend
            }
            None => {
                let Some(backend) = pools.pick(v, self.connection_hash(v, &key)) else {
                    return Verdict::Drop(NO_BACKEND);
                };
                // A reset of an unknown connection passes and leaves nothing behind.
                if tcp_flags & flags::RST == 0 {
                    let state = if key.proto == UDP {
                        UDP_STATE
                    } else if tcp_flags & flags::FIN != 0 {
                        CLOSING
                    } else if tcp_flags & flags::SYN != 0 {
                        NEW
                    } else {
                        ESTABLISHED
                    };
                    let a = Affinity {
                        state,
                        backend,
                        packets: 1,
                    };
                    if self.connections.add_entry(key, a, state, now).is_err() {
                        return Verdict::Drop(TABLE_FULL);
                    }
                    self.created += 1;
                }
                backend
            }
        };
        let to = &self.pools.backends[usize::from(backend)];
        let mut address = [0u8; 16];
        address[..4].copy_from_slice(&to.address);
        if rewrite(data, &mut d.parsed, Side::Dst, address, to.port).is_err() {
            return Verdict::Drop(TRUNCATED);
        }
        if let (Some(mac), Some(dst)) = (to.mac, data.get_mut(..6)) {
            dst.copy_from_slice(&mac);
        }
        Verdict::Forward(to.via)
    }

    /// The hash VIP `v`'s table is read with for the connection `key`.
    #[inline]
    fn connection_hash(&self, v: usize, key: &FlowKey) -> u64 {
        if self.pools.vips[v].by_client {
            self.hasher.hash(&FlowKey {
                src: key.src,
                ..FlowKey::EMPTY
            })
        } else {
            self.hasher.hash(key)
        }
    }

    /// A packet from a backend's side: an answer leaves from its VIP.
    fn toward_client(&self, data: &mut [u8], d: &mut PacketDesc) -> Verdict {
        let key = &d.parsed.key;
        if key.ip_version == 0 {
            return Verdict::Forward(self.clients);
        }
        let pools = &*self.pools;
        let backend = match (key.ip_version, key.proto) {
            (4, TCP | UDP) if !d.parsed.flags.has(ParseFlags::LATER_FRAGMENT) => {
                let src = [key.src[0], key.src[1], key.src[2], key.src[3]];
                pools
                    .backend_of
                    .get(&endpoint(src, key.src_port, key.proto))
            }
            _ => None,
        };
        let Some(&b) = backend else {
            return Verdict::Drop(NOT_BACKEND);
        };
        let vip = &pools.vips[usize::from(pools.backends[usize::from(b)].vip)];
        let mut address = [0u8; 16];
        address[..4].copy_from_slice(&vip.address);
        match rewrite(data, &mut d.parsed, Side::Src, address, vip.port) {
            Ok(()) => Verdict::Forward(self.clients),
            Err(_) => Verdict::Drop(TRUNCATED),
        }
    }

    fn expire(&mut self, now: u64, budget: usize) {
        self.connections.expire(now, budget, |_, _| {});
    }
}

impl Program for Lb {
    /// The next pools, made by a write to the backends.
    type Prepared = Pools;

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        let n = burst.len();
        for p in burst.iter_mut() {
            let d = p.desc;
            d.verdict = if d.in_port == self.clients {
                self.toward_backend(p.data, d)
            } else {
                self.toward_client(p.data, d)
            };
        }
        self.expire(ctx.now_ns, crate::sweep_budget(n));
    }

    /// Idle live ports still time affinities out.
    fn poll(&mut self, _out: &mut Burst, ctx: &mut Context) {
        self.expire(ctx.now_ns, crate::IDLE_SWEEP);
    }

    crate::synced_tables::synced_table_methods!(connections);

    crate::replicated_tables::replicated_table_methods!(
        connections,
        with_counts: false,
        key: connection_of,
        leases_checked
    );

    /// A reload keeps the health the control plane gave each backend still configured,
    /// and each connection on its backend while the configuration still has that backend
    /// serving the same VIP (found by address, port and protocol, wherever it now sits in
    /// the list); a connection whose backend left is dropped, and its next packet picks
    /// again (as IPVS forgets a connection whose real server is removed).
    fn inherit(&mut self, mut old: Self, _now_ns: u64) -> Vec<Carried> {
        let latest = Arc::clone(&old.newest.lock().unwrap_or_else(PoisonError::into_inner));
        let mut pools = Pools::clone(&self.pools);
        let mut health = Carried::entries("backends", 0, 0, "");
        let mut refill = Vec::new();
        for b in &mut pools.backends {
            let Some(&was) = latest.backend_of.get(&b.identity()) else {
                continue;
            };
            health.kept += 1;
            let was = &latest.backends[usize::from(was)];
            if b.state != was.state {
                b.state = was.state;
                refill.push(usize::from(b.vip));
            }
        }
        refill.sort_unstable();
        refill.dedup();
        for v in refill {
            pools.fill(v);
        }
        self.pools = Arc::new(pools);
        *self.newest.lock().unwrap_or_else(PoisonError::into_inner) = Arc::clone(&self.pools);
        // Old backend index -> new, for a backend still serving the same VIP.
        let vip_endpoint = |p: &Pools, b: &Backend| {
            let v = &p.vips[usize::from(b.vip)];
            (v.address, v.port)
        };
        let remap: Vec<Option<u16>> = (latest.backends.iter())
            .map(|was| {
                let now = *self.pools.backend_of.get(&was.identity())?;
                let b = &self.pools.backends[usize::from(now)];
                (vip_endpoint(&latest, was) == vip_endpoint(&self.pools, b)).then_some(now)
            })
            .collect();
        let mut connections = self.connections.adopt(&mut old.connections);
        let unchanged = (remap.iter().enumerate()).all(|(i, to)| *to == Some(i as u16));
        if !unchanged {
            let moves: Vec<(FlowKey, Option<u16>)> = (self.connections.iter())
                .map(|(key, a, _)| (*key, remap.get(usize::from(a.backend)).copied().flatten()))
                .collect();
            let mut left = 0;
            for (key, to) in moves {
                match (to, self.connections.find_id(&key)) {
                    (Some(to), Some(id)) => self.connections.value_mut(id).backend = to,
                    _ => left += u64::from(self.connections.delete(&key)),
                }
            }
            connections.leave_behind(left, "their backend left the configuration");
        }
        self.created += old.created;
        self.moved += old.moved;
        vec![connections, health]
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &[
            "no_vip",
            "no_backend",
            "table_full",
            "not_backend",
            "fragment",
            "truncated",
        ]
    }

    fn declarations(&self) -> Vec<Declaration> {
        vec![
            self.connections.declaration().clone(),
            backends_declaration(self.pools.max_backends, self.ports),
        ]
    }

    /// Health writes make the next pools here, on the control plane's thread, with the
    /// Maglev tables of the VIPs they change filled again.
    fn prepare(&self, request: &Request) -> Result<Option<Arc<Pools>>, ControlError> {
        let Request::Write { table, writes } = request else {
            return Ok(None);
        };
        if table != "backends" {
            return Ok(None);
        }
        let mut newest = self.newest.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = Pools::clone(&newest);
        next.apply(writes)?;
        let next = Arc::new(next);
        *newest = next.clone();
        Ok(Some(next))
    }

    fn control(
        &mut self,
        request: &Request,
        prepared: Option<&Arc<Pools>>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        if request.target() != "backends" {
            return self.connections.answer(request, ctx.now_ns);
        }
        match request {
            Request::Write { .. } => {
                self.pools = prepared.cloned().ok_or(ControlError::Unavailable)?;
                Ok(Reply::Done)
            }
            Request::Read { key: Some(key), .. } => {
                let (address, port, proto) = backend_key(key);
                let pools = &self.pools;
                let b = pools
                    .backend_of
                    .get(&endpoint(address, port, proto))
                    .ok_or(ControlError::NoSuchEntry {
                        table: "backends".into(),
                    })?;
                Ok(Reply::Page(
                    vec![pools.entry(&pools.backends[usize::from(*b)])],
                    None,
                ))
            }
            // The pools are shared: one worker reads and counts them; each counts the
            // connections it moved (summed over the workers).
            Request::Read { .. } if ctx.worker != 0 => Ok(Reply::Page(Vec::new(), None)),
            Request::Stats { .. } if ctx.worker != 0 => {
                Ok(Reply::Counters(vec![("moved", self.moved)]))
            }
            Request::Read { from, .. } => {
                let pools = &self.pools;
                let all = pools.present().map(|b| pools.entry(b));
                let (entries, next) = page(all, *from, pools.present().count());
                Ok(Reply::Page(entries, next))
            }
            Request::Stats { .. } => {
                let count = |state| self.pools.present().filter(|b| b.state == state).count();
                Ok(Reply::Counters(vec![
                    ("backends", self.pools.present().count() as u64),
                    ("up", count(BackendState::Up) as u64),
                    ("drain", count(BackendState::Drain) as u64),
                    ("down", count(BackendState::Down) as u64),
                    ("moved", self.moved),
                ]))
            }
            _ => Err(ControlError::Unavailable),
        }
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) {
        self.connections.take_notifications(out);
    }
}

#[cfg(test)]
mod tests;
