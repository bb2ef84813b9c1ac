//! `nat`: source NAT with port translation (NAPT, RFC 3022) for TCP, UDP and ICMP echo,
//! from an inside port to an outside port, every connection's translation kept by the data
//! plane itself.
//!
//! The first packet of a connection from the inside (PNA add-on-miss) picks an external
//! port (for ICMP echo, an identifier) from the pool, keeping the inside source port when
//! it is free, and adds two entries: the translation, keyed by the connection as the inside
//! sees it, and its reverse, keyed by the connection as the outside sees it, which leads
//! answers back to the translation. Packets from the inside leave with the external address
//! and port as their source; answers from the outside get the inside host's address and
//! port back as their destination. Checksums are updated incrementally (RFC 1624), so a
//! packet whose checksum was right stays right.
//!
//! Timeouts follow the RFCs' minimums for NATs: TCP connections being opened or closed
//! (`tcp_transitory`, RFC 5382: 4 min) and established (`tcp_established`, 2 h 4 min),
//! UDP (`udp`, RFC 4787: 5 min), ICMP echo (`icmp`, RFC 5508: 60 s). A TCP connection is
//! established once the outside answers; a FIN from either side moves it to the transitory
//! timeout, which later packets restart (a half-closed connection streams on); a RST
//! removes the translation after passing.
//!
//! Mapping and filtering (RFC 4787): by default a port per connection, shared across
//! destinations, and only answers come in. `mapping = "endpoint_independent"` gives an
//! inside endpoint one external port for all its connections, which no other endpoint
//! gets; `filtering` then lets a packet from an address the endpoint sent to, or from
//! anywhere, open a translation to it, as a port forward does.
//!
//! Port blocks (`port_block`): an inside host takes its external ports from blocks of
//! consecutive pool ports that serve no other host, at most `blocks_per_host` at a time,
//! as carrier-grade NATs allocate them, so that a host's ports are bounded and logged by
//! the block.
//!
//! Workers: each worker keeps its own translations, with no state shared between workers.
//! Offline, a worker picks only external ports whose answers the runtime's flow hash sends
//! back to it. On live ports `nat` asks the fanout groups to spread packets by the remote
//! address (`steering`), so a remote host's packets both ways, and the ICMP errors about
//! them, reach one worker, and any port's answers come back to the worker that chose it.
//!
//! ICMP errors (destination unreachable, fragmentation needed among them, time exceeded,
//! parameter problem) about a translated connection are translated as its packets are
//! (RFC 5508 section 4.2, RFC 5382 REQ-9): the error's own address, and in the packet it
//! quotes the address and port (echo: identifier) with the quoted IP and transport
//! checksums, so that path MTU discovery and traceroute work through the NAT. An error
//! quoting no translation is dropped as `no_translation`, one whose quote is not a whole
//! IPv4 header and 8 bytes of TCP, UDP or an echo as `unsupported`. Errors move no
//! translation's state or timer.
//!
//! Not translated: IPv6 and non-IP frames (ARP) pass unchanged between the two ports;
//! other IPv4 protocols and other ICMP messages are dropped as `unsupported`, later
//! fragments as `fragment`.
//!
//! State: `translations` (declared; key the inside 5-tuple and VLAN, action the TCP/UDP/ICMP
//! state with the external port and packet counts; write-centric: created per connection,
//! updated by every packet) and its reverse index (derived from it, kept alongside, and
//! made again after a synced write: `translations` may be `synced`).
//! Configuration: `external` (the public IPv4 address, required), `inside` and `outside`
//! (ports, default 0 and 1), `ports` (the pool, default `1024-65535`), `capacity`
//! (connections per worker, default 65536), `early_drop` (default true: a full table makes
//! room with an expired translation near the new one's slot, else the one closest to
//! expiry among unanswered TCP, UDP and ICMP ones, as Linux conntrack's early drop; the
//! dropped translation's port goes back to the pool), `timeouts` in seconds, `forwards` (port
//! forwards: a TCP SYN or UDP datagram from the outside to a forwarded external port opens
//! a translation to an inside host, as if that host had opened it; forwarded ports lie
//! outside the pool).

use crate::firewall::{self, Firewall, FirewallConfig};
use crate::keys::filled_table;
use crate::{ConfigError, PortNames, parse_ipv4};
use serde::Deserialize;
use stateplane_runtime::{
    Burst, Context, DropReason, FlowBytes, PacketDesc, PortId, Program, Steering, Verdict,
};
use stateplane_state::control::{Field, Format};
use stateplane_state::{
    AddError, Carried, ControlError, Declaration, DeclaredTable, ExactTable, ExpireProfile,
    NotLeased, Notification, Reply, Request, ValueCodec, params_into,
};
use stateplane_wire::arp::ArpPacket;
use stateplane_wire::edit::{self, EditError, Side};
use stateplane_wire::flow::shard_of;
use stateplane_wire::parse::{ParseFlags, Parsed};
use stateplane_wire::tcp::flags;
use stateplane_wire::{FlowKey, icmp};
use std::collections::HashMap;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatConfig {
    /// The public IPv4 address inside connections take.
    pub external: String,
    #[serde(default = "default_inside")]
    pub inside: String,
    #[serde(default = "default_outside")]
    pub outside: String,
    /// External ports (and ICMP identifiers) to choose from: `first-last`.
    #[serde(default = "default_ports")]
    pub ports: String,
    #[serde(default = "default_capacity")]
    pub capacity: usize,
    /// A full table drops an unestablished translation (TCP not answered yet), or a UDP
    /// or ICMP one closest to its timeout, to make room for a new one.
    #[serde(default = "crate::default_true")]
    pub early_drop: bool,
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Port forwards: connections from the outside to these external ports reach an inside
    /// host.
    #[serde(default)]
    pub forwards: Vec<PortForwardConfig>,
    /// What becomes of IPv6, which is not translated: `stateful` (the default), `pass`
    /// or `drop` ([`Ipv6`]).
    #[serde(default = "default_ipv6")]
    pub ipv6: String,
    /// A TCP or UDP connection's external port has the parity of its inside port (RFC
    /// 4787, 4.2.2: protocols such as RTP and RTCP pair ports by it).
    #[serde(default)]
    pub port_parity: bool,
    /// How an inside endpoint's connections take external ports (RFC 4787 section 4.1):
    /// `address_and_port_dependent` (the default: a port per connection, shared across
    /// destinations) or `endpoint_independent` (one port for all of the endpoint's
    /// connections, whatever their destination).
    #[serde(default = "default_behaviour")]
    pub mapping: String,
    /// What may come in to a mapped external port (RFC 4787 section 5):
    /// `address_and_port_dependent` (the default: only answers from where the endpoint
    /// sent), `address_dependent` (from any port of an address the endpoint sent to) or
    /// `endpoint_independent` (from anywhere); the latter two need endpoint-independent
    /// mapping.
    #[serde(default = "default_behaviour")]
    pub filtering: String,
    /// Port-block allocation: an inside host takes its external ports from blocks of this
    /// many consecutive pool ports, held by it alone ([`Blocks`]). Off when absent.
    pub port_block: Option<u32>,
    /// The most blocks an inside host holds at once under `port_block` (default 8).
    pub blocks_per_host: Option<u32>,
}

fn default_behaviour() -> String {
    "address_and_port_dependent".into()
}

/// What may open a translation from the outside to a mapped port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Filtering {
    /// Nothing: only answers to a translation come in.
    AddressAndPortDependent,
    /// A packet from an address the mapped endpoint has a translation to.
    AddressDependent,
    /// Any packet.
    EndpointIndependent,
}

impl Filtering {
    fn parse(field: &str, text: &str, independent_mapping: bool) -> Result<Self, ConfigError> {
        let filtering = match text {
            "address_and_port_dependent" => Filtering::AddressAndPortDependent,
            "address_dependent" => Filtering::AddressDependent,
            "endpoint_independent" => Filtering::EndpointIndependent,
            other => {
                return Err(ConfigError::new(
                    field,
                    format!(
                        "'{other}' is not address_and_port_dependent, address_dependent or \
                         endpoint_independent"
                    ),
                ));
            }
        };
        if filtering != Filtering::AddressAndPortDependent && !independent_mapping {
            return Err(ConfigError::new(
                field,
                format!(
                    "'{text}' needs mapping = \"endpoint_independent\": with a port per \
                     connection, an external port may serve several inside endpoints, so \
                     there is no one endpoint to let a packet through to"
                ),
            ));
        }
        Ok(filtering)
    }
}

/// Port-block allocation as `cfg` asks for it, in a pool of `pool` ports.
fn blocks_of(field: &str, cfg: &NatConfig, pool: u32) -> Result<Option<Blocks>, ConfigError> {
    let Some(size) = cfg.port_block else {
        return match cfg.blocks_per_host {
            Some(_) => Err(ConfigError::new(
                format!("{field}.blocks_per_host"),
                "bounds the blocks of port-block allocation, which is off: set port_block \
                 (ports a block) too, or remove blocks_per_host",
            )),
            None => Ok(None),
        };
    };
    let least = if cfg.port_parity { 2 } else { 1 };
    if size < least || size > pool {
        return Err(ConfigError::new(
            format!("{field}.port_block"),
            format!(
                "{size} ports a block: give {least} to {pool} (the pool `ports` holds {pool}{})",
                if cfg.port_parity {
                    "; under port_parity a block holds ports of both parities"
                } else {
                    ""
                }
            ),
        ));
    }
    let per_host = cfg.blocks_per_host.unwrap_or(8);
    if per_host == 0 {
        return Err(ConfigError::new(
            format!("{field}.blocks_per_host"),
            "0 blocks would leave a host no port: give 1 or more (default 8)",
        ));
    }
    Ok(Some(Blocks::new(size as u16, per_host as usize, pool)))
}

fn default_ipv6() -> String {
    "stateful".into()
}

/// What `nat` does with IPv6, which it does not translate.
#[derive(Clone)]
enum Ipv6 {
    /// `stateful`: connections opened from the inside pass, and their answers; nothing
    /// else from outside (RFC 6092's simple security, as `firewall` with no rules keeps
    /// it).
    Stateful(Box<Firewall>),
    /// `pass`: everything passes both ways, unchanged.
    Pass,
    /// `drop`: nothing passes (`ipv6`).
    Drop,
}

/// A port forward: `proto` to external port `port` goes to `to`, port `to_port` (by
/// default the same port).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortForwardConfig {
    pub proto: String,
    pub port: u16,
    pub to: String,
    pub to_port: Option<u16>,
}

/// A port forward, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PortForward {
    proto: u8,
    external_port: u16,
    inside: [u8; 16],
    inside_port: u16,
}

fn default_inside() -> String {
    "0".into()
}

fn default_outside() -> String {
    "1".into()
}

fn default_ports() -> String {
    "1024-65535".into()
}

fn default_capacity() -> usize {
    65_536
}

/// Idle timeouts in seconds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    pub tcp_transitory: f64,
    pub tcp_established: f64,
    pub udp: f64,
    pub icmp: f64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            tcp_transitory: 240.0,
            tcp_established: 7440.0,
            udp: 300.0,
            icmp: 60.0,
        }
    }
}

/// A translation's state; its discriminant is also its expiry profile's index.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Zeroable)]
#[repr(u8)]
pub enum NatState {
    /// TCP, opened from the inside, not answered yet.
    #[default]
    TcpNew = 0,
    TcpEstablished = 1,
    /// TCP with a FIN seen: ages out after its transitory timeout of idleness.
    TcpClosing = 2,
    Udp = 3,
    Icmp = 4,
}

/// State names in the control API, by `NatState` discriminant.
const STATES: [&str; 5] = ["tcp_new", "tcp_established", "tcp_closing", "udp", "icmp"];

impl NatState {
    fn from_index(i: usize) -> NatState {
        match i {
            1 => NatState::TcpEstablished,
            2 => NatState::TcpClosing,
            3 => NatState::Udp,
            4 => NatState::Icmp,
            _ => NatState::TcpNew,
        }
    }
}

/// A connection's translation: what the data plane updates in place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct Translation {
    pub state: NatState,
    /// The external port (ICMP: identifier) the connection took.
    pub external_port: u16,
    pub packets_out: u32,
    pub packets_in: u32,
}

struct TranslationCodec;

impl TranslationCodec {
    fn declaration(capacity: usize) -> Declaration {
        let params = vec![
            Field::exact("external_port", 16, Format::Int),
            Field::exact("packets_out", 32, Format::Int),
            Field::exact("packets_in", 32, Format::Int),
        ];
        filled_table::<FlowKey>("translations", "", capacity, &STATES, params)
    }
}

impl ValueCodec for TranslationCodec {
    type Key = FlowKey;
    type Value = Translation;
    const COUNTING: &'static [&'static str] = &["packets_out", "packets_in"];

    fn value(action: usize, params: &[u128]) -> Translation {
        let p = |i: usize| params.get(i).copied().unwrap_or(0);
        Translation {
            state: NatState::from_index(action),
            external_port: p(0) as u16,
            packets_out: p(1) as u32,
            packets_in: p(2) as u32,
        }
    }

    fn action_values(t: &Translation, out: &mut [u128]) -> (usize, usize) {
        let params = [
            u128::from(t.external_port),
            u128::from(t.packets_out),
            u128::from(t.packets_in),
        ];
        (t.state as usize, params_into(params, out))
    }
}

const NO_TRANSLATION: DropReason = DropReason::program(0);
const PORTS_EXHAUSTED: DropReason = DropReason::program(1);
const TABLE_FULL: DropReason = DropReason::program(2);
const UNSUPPORTED: DropReason = DropReason::program(3);
const FRAGMENT: DropReason = DropReason::program(4);
const TRUNCATED: DropReason = DropReason::program(5);
const OTHER_PORT: DropReason = DropReason::program(6);
const UNSOLICITED: DropReason = DropReason::program(7);
const INVALID: DropReason = DropReason::program(8);
const UNRELATED_ICMP: DropReason = DropReason::program(9);
const OUT_OF_WINDOW: DropReason = DropReason::program(10);
const IPV6: DropReason = DropReason::program(11);
const HAIRPIN_UNKNOWN: DropReason = DropReason::program(12);
const BLOCK_LIMIT: DropReason = DropReason::program(13);

/// Why `nat` drops an IPv6 packet its stateful policy's firewall refused.
fn ipv6_reason(firewall_reason: DropReason) -> DropReason {
    match firewall_reason {
        firewall::INVALID => INVALID,
        firewall::TABLE_FULL => TABLE_FULL,
        firewall::UNRELATED_ICMP => UNRELATED_ICMP,
        firewall::OUT_OF_WINDOW => OUT_OF_WINDOW,
        // `unsolicited`; and `denied` and `policed` need rules, which the policy has none of.
        _ => UNSOLICITED,
    }
}

/// External ports drawn at random for a new connection, per worker (with `n` workers
/// about one port in `n` sends its answers back to this worker), before its destination's
/// free ports are listed instead.
const PORT_TRIES_PER_WORKER: u32 = 64;
/// Translations to one destination on a worker past which its free ports are listed, so
/// that allocations stop drawing at random in a pool that is filling up.
const CROWDED: u32 = 256;

const ICMP: u8 = 1;
const TCP: u8 = 6;
const UDP: u8 = 17;

/// A connection's key as the tables hold it: no ingress port, and for ICMP echo no
/// type (a request and its reply are one connection, told apart by the identifier).
fn table_key(key: &FlowKey) -> FlowKey {
    let mut k = *key;
    k.in_port = 0;
    if k.proto == ICMP {
        k.dst_port = 0;
    }
    k
}

/// The table key of the answers to the inside connection `inside` once it goes out as
/// `external:port`.
fn answer_key(inside: &FlowKey, external: [u8; 16], port: u16) -> FlowKey {
    let mut k = FlowKey {
        src: inside.dst,
        dst: external,
        in_port: 0,
        ..*inside
    };
    if inside.proto == ICMP {
        (k.src_port, k.dst_port) = (port, 0);
    } else {
        (k.src_port, k.dst_port) = (inside.dst_port, port);
    }
    k
}

/// An answer key's destination: the remote endpoint and protocol, without the external
/// port (which is the answer's destination port; for ICMP, its identifier).
fn dest_of(answer: &FlowKey) -> FlowKey {
    let mut k = *answer;
    if k.proto == ICMP {
        k.src_port = 0;
    } else {
        k.dst_port = 0;
    }
    k
}

/// Whether an external port may serve an inside port under port parity (`parity`): of
/// the same parity, for TCP and UDP (an ICMP identifier has none to keep).
fn parity_kept(parity: bool, proto: u8, inside_port: u16, external_port: u16) -> bool {
    !parity || proto == ICMP || (inside_port ^ external_port) & 1 == 0
}

/// The external port of an answer key.
fn port_of(answer: &FlowKey) -> u16 {
    if answer.proto == ICMP {
        answer.src_port
    } else {
        answer.dst_port
    }
}

/// The answer entries (answer key -> inside key, one per translation) and, per
/// destination, how many ports it has in use here and, once crowded, the list of pool
/// ports it may have free. Every answer entry is added and deleted here, so the counts
/// stay exact; a listed port is checked when taken (a connection that kept its own source
/// port may have taken it meanwhile), so the list may hold stale or repeated ports, never
/// miss a free one.
#[derive(Clone)]
struct Answers {
    table: ExactTable<FlowKey, FlowKey>,
    dests: HashMap<FlowKey, Dest>,
    /// The pool: its first port and how many.
    pool: (u16, u32),
    /// Port parity: a destination's ports are counted and listed by parity, as two
    /// destinations, so that a list holds only ports its connections may take.
    parity: bool,
    /// Under endpoint-independent mapping, each endpoint's port; its ports are then
    /// counted and listed as one destination's, the pool's.
    mappings: Option<Mappings>,
    filtering: Filtering,
    /// Under port-block allocation, the blocks hosts hold.
    blocks: Option<Blocks>,
}

/// Endpoint-independent mapping (RFC 4787 REQ-1): an inside endpoint (protocol, address,
/// port or echo identifier, VLAN) keeps one external port for all its translations, and
/// that port serves no other endpoint. Kept from the translations' answer entries as they
/// come and go, so a mapping lives exactly as long as a translation uses it.
#[derive(Clone, Default)]
struct Mappings {
    /// An endpoint's external port.
    port_of: HashMap<FlowKey, u16>,
    /// (protocol, external port) -> the endpoint holding it and the translations on it.
    /// A reload that turns this mapping on may carry translations of two endpoints on one
    /// port: the first holds it, and it is free once both have ended.
    holder: HashMap<(u8, u16), (FlowKey, u32)>,
    /// Under address-dependent filtering, (endpoint, remote address) -> translations.
    peers: HashMap<(FlowKey, [u8; 16]), u32>,
}

/// The inside endpoint of the inside connection `inside`: its protocol, source address,
/// port (echo: identifier) and VLAN.
fn endpoint_of(inside: &FlowKey) -> FlowKey {
    FlowKey {
        src: inside.src,
        src_port: inside.src_port,
        proto: inside.proto,
        vlan: inside.vlan,
        ip_version: inside.ip_version,
        ..FlowKey::default()
    }
}

impl Mappings {
    fn add(&mut self, inside: &FlowKey, answer: &FlowKey, peers: bool) {
        let (endpoint, port) = (endpoint_of(inside), port_of(answer));
        let (holder, users) = (self.holder)
            .entry((inside.proto, port))
            .or_insert((endpoint, 0));
        *users += 1;
        if *holder == endpoint {
            self.port_of.entry(endpoint).or_insert(port);
        }
        if peers {
            *self.peers.entry((endpoint, answer.src)).or_default() += 1;
        }
    }

    fn delete(&mut self, inside: &FlowKey, answer: &FlowKey) {
        let (endpoint, port) = (endpoint_of(inside), port_of(answer));
        if let Some((holder, users)) = self.holder.get_mut(&(inside.proto, port)) {
            *users = users.saturating_sub(1);
            if *users == 0 {
                let holder = *holder;
                self.holder.remove(&(inside.proto, port));
                if self.port_of.get(&holder) == Some(&port) {
                    self.port_of.remove(&holder);
                }
            }
        }
        if let Some(n) = self.peers.get_mut(&(endpoint, answer.src)) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.peers.remove(&(endpoint, answer.src));
            }
        }
    }

    /// Whether no endpoint holds `port` for protocol `proto`.
    fn free(&self, proto: u8, port: u16) -> bool {
        !self.holder.contains_key(&(proto, port))
    }
}

/// Port-block allocation (as carrier-grade NATs offer it; RFC 6888 REQ-4 bounds a
/// host's ports, RFC 7422 logs a host's ports by the block rather than by connection):
/// an inside host (address and VLAN) takes its external ports from blocks of `size`
/// consecutive pool ports, which no other host's translations use, holding at most
/// `per_host` blocks at a time. A host takes a new block only when no port of the blocks
/// it holds serves the new connection, and a block goes back to the pool with its last
/// translation. Kept from the translations' answer entries as they come and go, as
/// [`Mappings`] are. The pool's last ports short of a whole block are not used.
#[derive(Clone)]
struct Blocks {
    size: u16,
    per_host: usize,
    /// By block (block `i` is the pool's ports `i × size` to `(i + 1) × size - 1` from
    /// its first): the host holding it and the translations on it. Free while none.
    /// A reload that turns blocks on may carry two hosts' translations on one block: the
    /// first holds it, and it is free once both have ended.
    held: Vec<(FlowKey, u32)>,
    /// How many blocks are held.
    in_use: usize,
    /// A host's blocks, in the order it took them.
    of_host: HashMap<FlowKey, Vec<u16>>,
    /// Where the search for a free block starts: after the last one taken.
    next: usize,
}

/// The inside host of the inside connection `inside`: its source address and VLAN.
fn host_of(inside: &FlowKey) -> FlowKey {
    FlowKey {
        src: inside.src,
        vlan: inside.vlan,
        ip_version: inside.ip_version,
        ..FlowKey::default()
    }
}

impl Blocks {
    fn new(size: u16, per_host: usize, pool: u32) -> Self {
        Blocks {
            size,
            per_host,
            held: vec![(FlowKey::default(), 0); (pool / u32::from(size)) as usize],
            in_use: 0,
            of_host: HashMap::new(),
            next: 0,
        }
    }

    /// The block of the pool port at `offset` from the pool's first; `None` past the
    /// last whole block (or outside the pool: a forwarded port).
    fn block_at(&self, offset: u16) -> Option<usize> {
        let block = usize::from(offset / self.size);
        (block < self.held.len()).then_some(block)
    }

    fn add(&mut self, inside: &FlowKey, offset: u16) {
        let Some(block) = self.block_at(offset) else {
            return;
        };
        let n = self.held.len();
        let (holder, users) = &mut self.held[block];
        if *users == 0 {
            *holder = host_of(inside);
            self.in_use += 1;
            self.of_host.entry(*holder).or_default().push(block as u16);
            self.next = (block + 1) % n;
        }
        *users += 1;
    }

    fn delete(&mut self, offset: u16) {
        let Some(block) = self.block_at(offset) else {
            return;
        };
        let (holder, users) = &mut self.held[block];
        if *users == 0 {
            return;
        }
        *users -= 1;
        if *users > 0 {
            return;
        }
        self.in_use -= 1;
        if let Some(blocks) = self.of_host.get_mut(holder) {
            blocks.retain(|&b| usize::from(b) != block);
            if blocks.is_empty() {
                self.of_host.remove(holder);
            }
        }
    }

    /// The blocks `host` holds.
    fn of(&self, host: &FlowKey) -> &[u16] {
        self.of_host.get(host).map_or(&[], Vec::as_slice)
    }

    /// A free block, searched from after the last one taken: none looked at when every
    /// block is held, else at most the pool's blocks (taken only when a host needs one).
    fn free(&self) -> Option<u16> {
        if self.in_use >= self.held.len() {
            return None;
        }
        let n = self.held.len();
        (0..n)
            .map(|i| (self.next + i) % n)
            .find(|&b| self.held[b].1 == 0)
            .map(|b| b as u16)
    }
}

#[derive(Clone, Default)]
struct Dest {
    in_use: u32,
    free: Option<Vec<u16>>,
}

impl Answers {
    /// What an answer's ports are counted and listed under: its destination, and under
    /// port parity the external port's parity.
    fn dest(&self, answer: &FlowKey) -> FlowKey {
        let mut dest = if self.mappings.is_some() {
            FlowKey {
                proto: answer.proto,
                ..FlowKey::default()
            }
        } else {
            dest_of(answer)
        };
        if self.parity && answer.proto != ICMP {
            dest.dst_port = port_of(answer) & 1;
        }
        dest
    }

    fn get(&self, answer: &FlowKey) -> Option<&FlowKey> {
        self.table.get(answer)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.len()
    }

    fn add(&mut self, answer: FlowKey, inside: FlowKey, now: u64) -> Result<(), AddError> {
        self.table.add_entry(answer, inside, 0, now)?;
        if let Some(m) = &mut self.mappings {
            m.add(
                &inside,
                &answer,
                self.filtering == Filtering::AddressDependent,
            );
        }
        if let Some(b) = &mut self.blocks {
            b.add(&inside, port_of(&answer).wrapping_sub(self.pool.0));
        }
        let dest = self.dest(&answer);
        self.dests.entry(dest).or_default().in_use += 1;
        Ok(())
    }

    /// Deletes an answer entry; its port goes back on its destination's list (a pool port;
    /// not a forwarded one).
    fn delete(&mut self, answer: &FlowKey) {
        // The inside connection is looked up only where a mapping needs it.
        let inside = (self.mappings.is_some())
            .then(|| self.table.get(answer).copied())
            .flatten();
        if !self.table.delete(answer) {
            return;
        }
        if let (Some(m), Some(inside)) = (&mut self.mappings, inside) {
            m.delete(&inside, answer);
        }
        if let Some(b) = &mut self.blocks {
            b.delete(port_of(answer).wrapping_sub(self.pool.0));
        }
        let dest = self.dest(answer);
        let Some(d) = self.dests.get_mut(&dest) else {
            return;
        };
        d.in_use = d.in_use.saturating_sub(1);
        let (first, pool) = self.pool;
        let port = port_of(answer);
        if d.in_use == 0 {
            self.dests.remove(&dest);
        } else if let Some(free) = &mut d.free
            && u32::from(port.wrapping_sub(first)) < pool
        {
            free.push(port);
            // Repeats of ports taken and freed by connections that kept their own ports:
            // when they outgrow the pool, the list starts again from what is free.
            if free.len() as u32 > 2 * pool {
                d.free = None;
            }
        }
    }
}

/// The next listed port of `dest` that `usable` accepts; `None` once its list is empty
/// (every port taken) or gone.
fn take_listed(
    dests: &mut HashMap<FlowKey, Dest>,
    dest: &FlowKey,
    usable: &impl Fn(u16) -> bool,
) -> Option<u16> {
    let free = dests.get_mut(dest)?.free.as_mut()?;
    while let Some(port) = free.pop() {
        if usable(port) {
            return Some(port);
        }
    }
    None
}

/// A port for the inside connection `key` from its host's blocks (pool ports from
/// `first`): its own source port if its host holds that port's block; else the first
/// port `usable` accepts in each block the host holds, each looked at from an offset
/// drawn from `hash`; else, if the host may take another block, its own port with the
/// block it lies in if that is free, or a free block's port. Looks at
/// no more ports than the host may hold, and refuses a host at its limit as
/// `block_limit`, any host when every block is held as `ports_exhausted`.
fn port_in_blocks(
    blocks: &Blocks,
    key: &FlowKey,
    first: u16,
    hash: u64,
    usable: &impl Fn(u16) -> bool,
) -> Result<u16, DropReason> {
    let held = blocks.of(&host_of(key));
    let holds = |offset: u16| {
        blocks
            .block_at(offset)
            .is_some_and(|b| held.contains(&(b as u16)))
    };
    if key.proto != ICMP && holds(key.src_port.wrapping_sub(first)) && usable(key.src_port) {
        return Ok(key.src_port);
    }
    let size = u32::from(blocks.size);
    let start = (hash % u64::from(size)) as u32;
    // Every port of a block lies in the pool, so `first` plus its offset is no more than
    // the pool's last port.
    let in_block = |block: u16| {
        (0..size)
            .map(|o| first + (u32::from(block) * size + (start + o) % size) as u16)
            .find(|&port| usable(port))
    };
    if let Some(port) = held.iter().find_map(|&b| in_block(b)) {
        return Ok(port);
    }
    if held.len() >= blocks.per_host {
        return Err(BLOCK_LIMIT);
    }
    // A new block: the one of its own port while free, so that the port is kept.
    let own = (key.proto != ICMP)
        .then(|| blocks.block_at(key.src_port.wrapping_sub(first)))
        .flatten()
        .filter(|&b| blocks.held[b].1 == 0 && usable(key.src_port));
    if own.is_some() {
        return Ok(key.src_port);
    }
    blocks.free().and_then(in_block).ok_or(PORTS_EXHAUSTED)
}

/// An IPv4 address as keys hold it (in their first 4 bytes).
fn v4(addr: &[u8; 16]) -> [u8; 4] {
    [addr[0], addr[1], addr[2], addr[3]]
}

/// Whether the packet is an ICMPv4 error: it quotes a packet rather than belongs to a
/// connection.
fn icmp_error(parsed: &Parsed) -> bool {
    !parsed.flags.has(ParseFlags::LATER_FRAGMENT) && icmp::is_error_key(&parsed.key)
}

/// The table key of the connection an ICMP error's quote belongs to, seen from the
/// other direction: the quote is a packet that went one way, the error goes back the
/// other. From the outside, the quote is a packet sent from the external address, and
/// this is its answers' key; from the inside, the quote is an answer as it reached the
/// inside host, and this is the inside connection's key. `None` when the quote is not
/// a whole IPv4 header and 8 bytes of TCP, UDP or an echo.
fn quoted_connection(parsed: &Parsed, data: &[u8]) -> Option<FlowKey> {
    let quoted = icmp::quoted_by(data, parsed).ok()?.key;
    let echo = quoted.proto == ICMP && icmp::types::is_echo(false, (quoted.dst_port >> 8) as u8);
    if !matches!(quoted.proto, TCP | UDP) && !echo {
        return None;
    }
    let mut key = quoted.reversed();
    if quoted.proto == ICMP {
        // An echo's identifier is its port on both sides.
        key.src_port = quoted.src_port;
    }
    Some(table_key(&key))
}

/// Whether the packet is one `nat` translates: TCP, UDP, or an ICMP echo request (`out`)
/// or reply (from the outside); `Err` with the reason to drop it otherwise.
fn translatable(parsed: &Parsed, data: &[u8], out: bool) -> Result<(), DropReason> {
    let f = parsed.flags;
    if f.has(ParseFlags::LATER_FRAGMENT) {
        return Err(FRAGMENT);
    }
    match parsed.key.proto {
        TCP | UDP => Ok(()),
        ICMP => {
            let t = data.get(usize::from(parsed.l4_offset)).copied();
            let want = if out {
                icmp::types::V4_ECHO_REQUEST
            } else {
                icmp::types::V4_ECHO_REPLY
            };
            if t == Some(want) {
                Ok(())
            } else {
                Err(UNSUPPORTED)
            }
        }
        _ => Err(UNSUPPORTED),
    }
}

/// Rewrites one side's address and port (ICMP: the echo identifier, which sits where the
/// source port is in the key) and updates the packet's key to match. Checksums are
/// updated incrementally.
pub(crate) fn rewrite(
    data: &mut [u8],
    parsed: &mut Parsed,
    side: Side,
    addr: [u8; 16],
    port: u16,
) -> Result<(), EditError> {
    edit::set_ip_addr(data, parsed, side, &addr[..4])?;
    if parsed.key.proto == ICMP {
        edit::set_echo_id(data, parsed, port)?;
        parsed.key.src_port = port;
    } else {
        edit::set_port(data, parsed, side, port)?;
    }
    let key = &mut parsed.key;
    match side {
        Side::Src => key.src = addr,
        Side::Dst => key.dst = addr,
    }
    if key.proto != ICMP {
        match side {
            Side::Src => key.src_port = port,
            Side::Dst => key.dst_port = port,
        }
    }
    Ok(())
}

/// Replicated translations (docs/REPLICATION.md): a connection is a flow named by its
/// inside key, and its answers name it by an alias, their own key, written with it (an
/// answer reaching a switch that holds no translation for it finds the connection so).
/// Both names start with the remote end (address, port, protocol), their hash tag, so
/// that a Redis Cluster keeps them in one slot; then the near end (inside host, or
/// external address, with its port), the VLAN, and which name it is. IPv4 only, as the
/// translations are.
mod replicated {
    use super::{ICMP, port_of};
    use stateplane_runtime::FlowBytes;
    use stateplane_wire::FlowKey;

    /// Remote address, port and protocol.
    const TAG: usize = 7;
    const LEN: usize = TAG + 6 + 2 + 1;
    const CONNECTION: u8 = 0;
    const ANSWER: u8 = 1;

    fn name(
        remote: ([u8; 16], u16, u8),
        near: ([u8; 16], u16),
        vlan: u16,
        kind: u8,
    ) -> Option<FlowBytes> {
        let mut b = [0u8; LEN];
        b[..4].copy_from_slice(&remote.0[..4]);
        b[4..6].copy_from_slice(&remote.1.to_be_bytes());
        b[6] = remote.2;
        b[7..11].copy_from_slice(&near.0[..4]);
        b[11..13].copy_from_slice(&near.1.to_be_bytes());
        b[13..15].copy_from_slice(&vlan.to_be_bytes());
        b[15] = kind;
        FlowBytes::tagged(&b, TAG)
    }

    /// The flow of an inside connection (its table key).
    pub(super) fn connection(inside: &FlowKey) -> Option<FlowBytes> {
        let remote = (inside.dst, inside.dst_port, inside.proto);
        name(
            remote,
            (inside.src, inside.src_port),
            inside.vlan,
            CONNECTION,
        )
    }

    /// The alias of the connection its answers (table key `answer`) belong to.
    pub(super) fn answer(answer: &FlowKey) -> Option<FlowBytes> {
        // An echo reply's identifier is the external one: the near end's port.
        let remote_port = if answer.proto == ICMP {
            0
        } else {
            answer.src_port
        };
        let remote = (answer.src, remote_port, answer.proto);
        name(remote, (answer.dst, port_of(answer)), answer.vlan, ANSWER)
    }

    /// The inside connection a flow names; `None` for an alias or bytes of no flow.
    pub(super) fn inside_of(flow: &FlowBytes) -> Option<FlowKey> {
        let b: &[u8; LEN] = flow.as_bytes().try_into().ok()?;
        if b[15] != CONNECTION {
            return None;
        }
        let (mut src, mut dst) = ([0u8; 16], [0u8; 16]);
        dst[..4].copy_from_slice(&b[..4]);
        src[..4].copy_from_slice(&b[7..11]);
        Some(FlowKey {
            src,
            dst,
            src_port: u16::from_be_bytes([b[11], b[12]]),
            dst_port: u16::from_be_bytes([b[4], b[5]]),
            vlan: u16::from_be_bytes([b[13], b[14]]),
            in_port: 0,
            proto: b[6],
            ip_version: 4,
        })
    }
}

#[derive(Clone)]
pub struct Nat {
    inside: PortId,
    outside: PortId,
    external: [u8; 16],
    translations: DeclaredTable<TranslationCodec>,
    answers: Answers,
    /// Ports looked at to allocate them (to check that an allocation costs O(1)).
    pub port_probes: u64,
    forwards: Vec<PortForward>,
    /// Translations made, and those that expired by the state they were in.
    pub created: u64,
    pub expired: [u64; 5],
    ipv6: Ipv6,
    /// Inside hosts' MACs, learnt from their ARP and their new connections (at most
    /// `capacity`): where a hairpinned packet to one of them goes.
    neighbors: HashMap<[u8; 4], [u8; 6]>,
    capacity: usize,
}

impl Nat {
    pub fn new(
        cfg: &NatConfig,
        ports: &PortNames,
        field: &str,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        let external = parse_ipv4(&format!("{field}.external"), &cfg.external)?;
        let (first_port, last_port) = parse_pool(&format!("{field}.ports"), &cfg.ports)?;
        let mut forwards = Vec::new();
        for (i, f) in cfg.forwards.iter().enumerate() {
            let at = format!("{field}.forwards[{i}]");
            let proto = match f.proto.as_str() {
                "tcp" => TCP,
                "udp" => UDP,
                other => {
                    return Err(ConfigError::new(
                        format!("{at}.proto"),
                        format!("'{other}' is not tcp or udp"),
                    ));
                }
            };
            if (first_port..=last_port).contains(&f.port) || f.port == 0 {
                return Err(ConfigError::new(
                    format!("{at}.port"),
                    format!(
                        "{} is 0 or in the pool {first_port}-{last_port}, which new connections \
                         take ports from; forward a port outside it, or narrow `ports`",
                        f.port
                    ),
                ));
            }
            if forwards
                .iter()
                .any(|x: &PortForward| (x.proto, x.external_port) == (proto, f.port))
            {
                return Err(ConfigError::new(
                    format!("{at}.port"),
                    format!("{} {} is forwarded twice", f.proto, f.port),
                ));
            }
            let mut inside = [0u8; 16];
            inside[..4].copy_from_slice(&parse_ipv4(&format!("{at}.to"), &f.to)?);
            forwards.push(PortForward {
                proto,
                external_port: f.port,
                inside,
                inside_port: f.to_port.unwrap_or(f.port),
            });
        }
        crate::check_capacity(&format!("{field}.capacity"), cfg.capacity, "connections")?;
        let inside = ports.resolve(&format!("{field}.inside"), &cfg.inside)?;
        let outside = ports.resolve(&format!("{field}.outside"), &cfg.outside)?;
        if inside == outside {
            return Err(ConfigError::new(
                format!("{field}.outside"),
                "the outside port must differ from the inside port",
            ));
        }
        let t = &cfg.timeouts;
        // By `NatState` discriminant.
        let profiles = crate::idle_profiles(
            &format!("{field}.timeouts"),
            &[
                ("tcp_transitory", t.tcp_transitory),
                ("tcp_established", t.tcp_established),
                ("tcp_transitory", t.tcp_transitory),
                ("udp", t.udp),
                ("icmp", t.icmp),
            ],
        )?;
        let ipv6 = match cfg.ipv6.as_str() {
            "pass" => Ipv6::Pass,
            "drop" => Ipv6::Drop,
            // As many IPv6 connections as translations; its memory is claimed under
            // `capacity`, which sizes both.
            "stateful" => Ipv6::Stateful(Box::new(Firewall::new(
                &FirewallConfig {
                    inside: cfg.inside.clone(),
                    connections: cfg.capacity,
                    // No rules: every connection the inside opens is permitted.
                    capacity: 1,
                    ..FirewallConfig::default()
                },
                ports,
                field,
                seed.rotate_left(13),
            )?)),
            other => {
                return Err(ConfigError::new(
                    format!("{field}.ipv6"),
                    format!("'{other}' is not stateful, pass or drop"),
                ));
            }
        };
        let independent = match cfg.mapping.as_str() {
            "address_and_port_dependent" => false,
            "endpoint_independent" => true,
            other => {
                return Err(ConfigError::new(
                    format!("{field}.mapping"),
                    format!("'{other}' is not address_and_port_dependent or endpoint_independent"),
                ));
            }
        };
        let filtering =
            Filtering::parse(&format!("{field}.filtering"), &cfg.filtering, independent)?;
        let pool = u32::from(last_port - first_port) + 1;
        let blocks = blocks_of(field, cfg, pool)?;
        let mut external_bytes = [0u8; 16];
        external_bytes[..4].copy_from_slice(&external);
        let mut translations =
            crate::budgeted_table(&format!("{field}.capacity"), cfg.capacity, &profiles, seed)?;
        if cfg.early_drop {
            let states = [NatState::TcpNew, NatState::Udp, NatState::Icmp];
            translations.set_early_drop(&states.map(|s| s as u8));
        }
        Ok(Nat {
            inside,
            outside,
            external: external_bytes,
            translations: DeclaredTable::new(
                translations,
                TranslationCodec::declaration(cfg.capacity),
            ),
            answers: Answers {
                table: crate::budgeted_table(
                    &format!("{field}.capacity"),
                    cfg.capacity,
                    &[ExpireProfile::NEVER],
                    seed.rotate_left(7),
                )?,
                dests: HashMap::new(),
                pool: (first_port, pool),
                parity: cfg.port_parity,
                mappings: independent.then(Mappings::default),
                filtering,
                blocks,
            },
            port_probes: 0,
            forwards,
            created: 0,
            expired: [0; 5],
            ipv6,
            neighbors: HashMap::new(),
            capacity: cfg.capacity,
        })
    }

    /// Takes `old`'s translations (a reload) while the external address stays, whatever
    /// the pool, forwards and timeouts now say: a connection keeps its port until it ends,
    /// as Linux keeps a connection's NAT binding when its MASQUERADE rule changes. As many
    /// as the new capacity holds; the answer entries follow the translations kept. A new
    /// external address leaves them all behind: their answers come to an address that is
    /// no longer this NAT's.
    fn inherit_translations(&mut self, old: &mut Nat, now_ns: u64) -> Carried {
        if old.external != self.external {
            let address = |a: &[u8; 16]| std::net::Ipv4Addr::from(v4(a));
            return Carried::afresh(
                "translations",
                format!(
                    "the external address changed from {} to {}",
                    address(&old.external),
                    address(&self.external)
                ),
            );
        }
        let carried = self.translations.adopt(&mut old.translations);
        // The destinations are counted by parity or not: as the old ones were, or again.
        let (new, was) = (&self.answers, &old.answers);
        // Blocks are numbered from the pool's first port.
        let blocks = |a: &Answers| a.blocks.as_ref().map(|b| (b.size, b.held.len(), a.pool));
        let whole = !carried.lost()
            && was.parity == new.parity
            && was.mappings.is_some() == new.mappings.is_some()
            && was.filtering == new.filtering
            && blocks(was) == blocks(new)
            && self.answers.table.adopt(&mut old.answers.table).dropped == 0;
        if whole {
            self.answers.dests = std::mem::take(&mut old.answers.dests);
            self.answers.mappings = old.answers.mappings.take();
            if let (Some(b), Some(was)) = (&mut self.answers.blocks, old.answers.blocks.take()) {
                *b = Blocks {
                    per_host: b.per_host,
                    ..was
                };
            }
        } else {
            // The tables are the same size: every translation kept has room for its answer.
            let kept = (self.translations.iter())
                .map(|(k, t, _)| (*k, *t))
                .collect();
            self.answer_again(kept, now_ns);
        }
        // The lists of free ports were of the old pool: listed again when next crowded.
        for d in self.answers.dests.values_mut() {
            d.free = None;
        }
        carried
    }

    /// Makes the answer entries, the destinations' counts, the mappings and the blocks
    /// again from `translations` (every one the table holds), in their order: one whose
    /// answer an earlier one already has (the same remote end and external port) is
    /// deleted, as is one the answers' table has no room for. How many were deleted.
    fn answer_again(&mut self, translations: Vec<(FlowKey, Translation)>, now_ns: u64) -> u64 {
        let answers = &mut self.answers;
        answers.table.clear();
        answers.dests.clear();
        if let Some(m) = &mut answers.mappings {
            *m = Mappings::default();
        }
        if let Some(b) = &mut answers.blocks {
            *b = Blocks::new(b.size, b.per_host, answers.pool.1);
        }
        let mut deleted = 0;
        for (inside, t) in translations {
            let answer = answer_key(&inside, self.external, t.external_port);
            if self.answers.add(answer, inside, now_ns).is_err() {
                self.translations.delete(&inside);
                deleted += 1;
            }
        }
        deleted
    }

    /// The translation of the inside connection `key` (as a packet from the inside has it).
    pub fn translation_of(&self, key: &FlowKey) -> Option<Translation> {
        self.translations.get(&table_key(key)).copied()
    }

    pub fn len(&self) -> usize {
        self.translations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.translations.is_empty()
    }

    /// A free external port for the inside connection `key` whose answers come back to
    /// this worker: the inside source port if it is one; else, while its destination has
    /// few translations here, ports drawn at random from a hash of the connection (random,
    /// not a walk from one start, because inside ports cluster in ephemeral ranges); else,
    /// or once the draws fail, the next of the destination's listed free ports. Each
    /// allocation looks at O(1) ports amortized, and so does a refusal of a destination
    /// whose ports are all taken (its list is empty).
    fn choose_port(&mut self, key: &FlowKey, ctx: &Context) -> Result<u16, DropReason> {
        let (external, (first, pool)) = (self.external, self.answers.pool);
        let parity = self.answers.parity;
        let mappings = self.answers.mappings.as_ref();
        if let Some(&port) = mappings.and_then(|m| m.port_of.get(&endpoint_of(key))) {
            // The endpoint's port; taken for this destination only where a reload carried
            // another endpoint's connection on it.
            let answer = answer_key(key, external, port);
            return (self.answers.get(&answer).is_none())
                .then_some(port)
                .ok_or(PORTS_EXHAUSTED);
        }
        // The destination's ports of the parity this connection may take.
        let dest = self
            .answers
            .dest(&answer_key(key, external, key.src_port & 1));
        let (table, dests) = (&self.answers.table, &mut self.answers.dests);
        let probes = std::cell::Cell::new(0u64);
        let usable = |port: u16| {
            probes.set(probes.get() + 1);
            if !parity_kept(parity, key.proto, key.src_port, port) {
                return false;
            }
            let answer = answer_key(key, external, port);
            // Live ports spread by the remote address (`steering`): any port comes back here.
            let here = !ctx.by_hash
                || ctx.workers <= 1
                || shard_of(ctx.hasher.hash_connection(&answer), ctx.workers) == ctx.worker;
            here && table.find_id(&answer).is_none()
                && mappings.is_none_or(|m| m.free(key.proto, port))
        };
        if let Some(blocks) = &self.answers.blocks {
            let chosen = port_in_blocks(blocks, key, first, ctx.hasher.hash(key), &usable);
            self.port_probes += probes.get();
            return chosen;
        }
        let chosen = 'chosen: {
            let offset = u32::from(key.src_port.wrapping_sub(first));
            if offset < pool && key.proto != ICMP && usable(key.src_port) {
                break 'chosen Some(key.src_port);
            }
            let crowded = (dests.get(&dest)).map(|d| (d.in_use >= CROWDED, d.free.is_some()));
            if let Some((_, true)) = crowded {
                break 'chosen take_listed(dests, &dest, &usable);
            }
            let tries = PORT_TRIES_PER_WORKER * ctx.workers.max(1) as u32;
            if pool > tries && crowded.is_none_or(|(c, _)| !c) {
                let mut h = ctx.hasher.hash(key);
                let drawn = (0..tries).find_map(|_| {
                    h = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mixed = (h ^ (h >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    let port = first + ((mixed >> 32) % u64::from(pool)) as u16;
                    usable(port).then_some(port)
                });
                if drawn.is_some() {
                    break 'chosen drawn;
                }
            }
            // Crowded, or the draws failed: list the free ports once, then take from them.
            let free: Vec<u16> = (0..pool)
                .map(|o| first + o as u16)
                .filter(|&p| usable(p))
                .collect();
            dests.entry(dest).or_default().free = Some(free);
            take_listed(dests, &dest, &usable)
        };
        self.port_probes += probes.get();
        chosen.ok_or(PORTS_EXHAUSTED)
    }

    /// Adds the translation of `key` and its answer entry.
    fn create(&mut self, key: FlowKey, ctx: &Context, now: u64) -> Result<u16, DropReason> {
        let port = self.choose_port(&key, ctx)?;
        self.insert(key, port, true, now)?;
        Ok(port)
    }

    /// Adds the translation of the inside connection `key` on external `port`, and its
    /// answer entry, counting its first packet (from the inside if `out`). A full table
    /// makes room with an expired or unestablished translation (with `early_drop`), whose
    /// answer entry and port go with it.
    fn insert(&mut self, key: FlowKey, port: u16, out: bool, now: u64) -> Result<(), DropReason> {
        let state = if key.proto == TCP {
            NatState::TcpNew
        } else if key.proto == UDP {
            NatState::Udp
        } else {
            NatState::Icmp
        };
        let t = Translation {
            state,
            external_port: port,
            packets_out: u32::from(out),
            packets_in: u32::from(!out),
        };
        let (_, gone) = (self.translations)
            .add_entry_evicting(key, t, state as u8, now)
            .map_err(|_| TABLE_FULL)?;
        if let Some((old, old_t)) = gone {
            self.answers
                .delete(&answer_key(&old, self.external, old_t.external_port));
        }
        // Every translation has one answer entry and the tables are the same size, so
        // there is room.
        let answer = answer_key(&key, self.external, port);
        if self.answers.add(answer, key, now).is_err() {
            self.translations.delete(&key);
            return Err(TABLE_FULL);
        }
        self.created += 1;
        Ok(())
    }

    /// A connection from the outside to a forwarded port: its translation, to the inside
    /// host, made on its first packet (a TCP SYN, or any UDP datagram). Returns the inside
    /// connection's key.
    fn forwarded(&mut self, outside: &FlowKey, tcp_flags: u8, now: u64) -> Option<FlowKey> {
        let f = *self
            .forwards
            .iter()
            .find(|f| (f.proto, f.external_port) == (outside.proto, outside.dst_port))?;
        if f.proto == TCP && tcp_flags & (flags::SYN | flags::ACK | flags::RST) != flags::SYN {
            return None;
        }
        let inside = FlowKey {
            src: f.inside,
            src_port: f.inside_port,
            dst: outside.src,
            dst_port: outside.src_port,
            in_port: 0,
            ..*outside
        };
        self.insert(inside, f.external_port, false, now).ok()?;
        Some(inside)
    }

    /// A packet from the outside to a mapped port that its filtering lets in (a TCP SYN,
    /// or any UDP datagram; RFC 4787 REQ-8, RFC 5382 REQ-3): a translation to the
    /// endpoint holding the port, made as a forwarded port's is. Returns its inside key.
    fn let_in(&mut self, outside: &FlowKey, tcp_flags: u8, now: u64) -> Option<FlowKey> {
        let answers = &self.answers;
        let mappings = answers.mappings.as_ref()?;
        let opens = match outside.proto {
            TCP => tcp_flags & (flags::SYN | flags::ACK | flags::RST) == flags::SYN,
            proto => proto == UDP,
        };
        if answers.filtering == Filtering::AddressAndPortDependent || !opens {
            return None;
        }
        let (endpoint, _) = mappings.holder.get(&(outside.proto, outside.dst_port))?;
        if answers.filtering == Filtering::AddressDependent
            && !mappings.peers.contains_key(&(*endpoint, outside.src))
        {
            return None;
        }
        let inside = FlowKey {
            src: endpoint.src,
            src_port: endpoint.src_port,
            dst: outside.src,
            dst_port: outside.src_port,
            in_port: 0,
            ..*outside
        };
        self.insert(inside, outside.dst_port, false, now).ok()?;
        Some(inside)
    }

    /// Removes a translation and its answer entry.
    fn remove(&mut self, key: &FlowKey, port: u16) {
        self.translations.delete(key);
        self.answers.delete(&answer_key(key, self.external, port));
    }

    /// Counts a packet of the translation `key` (from the inside if `out`) and moves its
    /// state and timer on; a RST removes it. Returns its external port (`None`: no
    /// translation). A packet whose lease is to be checked (`check`, where the table
    /// checks leases) finds only a translation marked leased: [`NotLeased`] otherwise.
    fn track(
        &mut self,
        key: &FlowKey,
        out: bool,
        tcp_flags: u8,
        now: u64,
        check: Option<u16>,
    ) -> Result<Option<u16>, NotLeased> {
        let Some(id) = self.translations.lookup_leased(key, now, check)? else {
            return Ok(None);
        };
        let t = self.translations.value_mut(id);
        if out {
            t.packets_out = t.packets_out.saturating_add(1);
        } else {
            t.packets_in = t.packets_in.saturating_add(1);
        }
        let (port, before) = (t.external_port, t.state);
        if key.proto == TCP {
            if tcp_flags & flags::RST != 0 {
                self.remove(key, port);
                return Ok(Some(port));
            }
            if tcp_flags & flags::FIN != 0 {
                t.state = NatState::TcpClosing;
            } else if before == NatState::TcpNew && !out {
                t.state = NatState::TcpEstablished;
            }
        }
        let after = t.state;
        if after != before {
            let _ = self.translations.set_profile(id, after as u8, now);
        } else if after != NatState::TcpNew {
            // Timeouts are idle timeouts (RFC 5382 REQ-5), a half-closed connection's
            // too: the side that did not close may stream on for as long as it likes.
            self.translations.restart_timer(id, now);
        }
        Ok(Some(port))
    }

    /// A packet from the inside: translated on its way out.
    fn outbound(&mut self, data: &mut [u8], d: &mut PacketDesc, ctx: &Context) -> Verdict {
        if d.parsed.key.ip_version != 4 {
            return self.untranslated(data, d, ctx.by_hash, self.outside);
        }
        if icmp_error(&d.parsed) {
            return self.error_out(data, d);
        }
        if let Err(reason) = translatable(&d.parsed, data, true) {
            return Verdict::Drop(reason);
        }
        let key = table_key(&d.parsed.key);
        let hairpin = key.dst == self.external;
        if hairpin && key.proto == ICMP {
            // An echo to the NAT's own address: nothing inside answers for it.
            return Verdict::Drop(NO_TRANSLATION);
        }
        let tcp_flags = d.parsed.tcp_flags;
        let Ok(tracked) = self.track(&key, true, tcp_flags, d.ts_ns, d.lease_check) else {
            return Verdict::Drop(DropReason::NOT_LEASED);
        };
        let port = match tracked {
            Some(port) => port,
            // A reset of nothing we translate would leak the inside address.
            None if key.proto == TCP && tcp_flags & flags::RST != 0 => {
                return Verdict::Drop(NO_TRANSLATION);
            }
            None => match self.create(key, ctx, d.ts_ns) {
                Ok(port) => {
                    // A host a hairpinned packet may reach: one that sends to the external
                    // address itself (its peers answer there), and, where a forward or the
                    // filtering opens connections from outside, any. Other new connections
                    // pay nothing for it.
                    let opens_in = !self.forwards.is_empty()
                        || self.answers.filtering != Filtering::AddressAndPortDependent;
                    if hairpin || opens_in {
                        self.learn(v4(&key.src), &data[6..12]);
                    }
                    port
                }
                Err(reason) => return Verdict::Drop(reason),
            },
        };
        match rewrite(data, &mut d.parsed, Side::Src, self.external, port) {
            Ok(()) if hairpin => self.hairpin(data, d),
            Ok(()) => Verdict::Forward(self.outside),
            Err(_) => Verdict::Drop(TRUNCATED),
        }
    }

    /// A packet from the inside to the external address, its source translated, goes back
    /// in as a packet from the outside would, answer or new connection to a forwarded or
    /// mapped port (hairpinning: RFC 4787 REQ-9, RFC 5382 REQ-8), so that inside hosts
    /// reach each other by their external endpoints. It goes to the inside host's MAC,
    /// from the MAC its sender addressed (the gateway's); a host whose MAC is not known
    /// yet (no ARP or connection of its seen) is `hairpin_unknown`.
    fn hairpin(&mut self, data: &mut [u8], d: &mut PacketDesc) -> Verdict {
        let outside = table_key(&d.parsed.key);
        // The connection it reaches is not the one it was admitted by (as without leases
        // checked, where the stage admits it by its sender's).
        let Ok(Some(inside)) = self.admit(&outside, d.parsed.tcp_flags, d.ts_ns, None) else {
            return Verdict::Drop(NO_TRANSLATION);
        };
        let Some(mac) = self.neighbors.get(&v4(&inside.src)).copied() else {
            return Verdict::Drop(HAIRPIN_UNKNOWN);
        };
        if rewrite(data, &mut d.parsed, Side::Dst, inside.src, inside.src_port).is_err() {
            return Verdict::Drop(TRUNCATED);
        }
        data.copy_within(0..6, 6);
        data[..6].copy_from_slice(&mac);
        Verdict::Forward(self.inside)
    }

    /// Remembers inside host `address`'s MAC, while there is room for another host.
    fn learn(&mut self, address: [u8; 4], mac: &[u8]) {
        let Ok(mac) = <[u8; 6]>::try_from(mac) else {
            return;
        };
        if self.neighbors.len() < self.capacity || self.neighbors.contains_key(&address) {
            self.neighbors.insert(address, mac);
        }
    }

    /// The inside connection a packet from the outside (its table key `outside`) belongs
    /// to: an answer to a translation, counted; else a new connection to a forwarded port,
    /// or one the filtering lets in to a mapped port. A packet whose lease is to be
    /// checked (`check`) is [`NotLeased`] unless its translation is here, marked leased
    /// (one with none here is the replication stage's to find by its alias).
    fn admit(
        &mut self,
        outside: &FlowKey,
        tcp_flags: u8,
        now: u64,
        check: Option<u16>,
    ) -> Result<Option<FlowKey>, NotLeased> {
        let answer = self.answers.get(outside).copied();
        if answer.is_none() {
            self.translations.no_key_leased(check)?;
        }
        Ok(match answer {
            Some(inside) if self.track(&inside, false, tcp_flags, now, check)?.is_some() => {
                Some(inside)
            }
            stale => {
                // An answer entry whose translation has expired (the sweep has not reached
                // it yet) goes with it now, so that a forwarded port takes the packet.
                if let Some(inside) = stale
                    && let Some(t) = self.translations.get(&inside).copied()
                {
                    self.expired[t.state as usize] += 1;
                    self.remove(&inside, t.external_port);
                }
                (self.forwarded(outside, tcp_flags, now))
                    .or_else(|| self.let_in(outside, tcp_flags, now))
            }
        })
    }

    /// A packet from the outside: an answer to a translation goes in, restored.
    fn inbound(&mut self, data: &mut [u8], d: &mut PacketDesc, by_hash: bool) -> Verdict {
        if d.parsed.key.ip_version != 4 {
            return self.untranslated(data, d, by_hash, self.inside);
        }
        if d.parsed.key.dst != self.external {
            return Verdict::Drop(NO_TRANSLATION);
        }
        if icmp_error(&d.parsed) {
            return self.error_in(data, d);
        }
        if let Err(reason) = translatable(&d.parsed, data, false) {
            return Verdict::Drop(reason);
        }
        let outside = table_key(&d.parsed.key);
        let inside = match self.admit(&outside, d.parsed.tcp_flags, d.ts_ns, d.lease_check) {
            Ok(Some(inside)) => inside,
            Ok(None) => return Verdict::Drop(NO_TRANSLATION),
            Err(NotLeased) => return Verdict::Drop(DropReason::NOT_LEASED),
        };
        match rewrite(data, &mut d.parsed, Side::Dst, inside.src, inside.src_port) {
            Ok(()) => Verdict::Forward(self.inside),
            Err(_) => Verdict::Drop(TRUNCATED),
        }
    }

    /// A packet `nat` does not translate, to port `to`: IPv6 as its policy says; non-IP
    /// frames (ARP) pass.
    fn untranslated(&mut self, data: &[u8], d: &PacketDesc, by_hash: bool, to: PortId) -> Verdict {
        if d.parsed.flags.has(ParseFlags::ARP) && to == self.outside {
            // An inside host's ARP names its address and MAC (the parser checked its length).
            let arp = ArpPacket::new_unchecked(&data[usize::from(d.parsed.l3_offset)..]);
            self.learn(arp.sender_ip().octets(), &arp.sender_mac().0);
        }
        if d.parsed.key.ip_version != 6 {
            return Verdict::Forward(to);
        }
        match &mut self.ipv6 {
            Ipv6::Pass => Verdict::Forward(to),
            Ipv6::Drop => Verdict::Drop(IPV6),
            Ipv6::Stateful(firewall) => match firewall.judge_packet(d, || data, by_hash) {
                None => Verdict::Forward(to),
                Some(reason) => Verdict::Drop(ipv6_reason(reason)),
            },
        }
    }

    /// Looks at `budget` slots of each table for entries idle past their timeouts.
    fn expire_all(&mut self, now: u64, budget: usize) {
        self.expire(now, budget);
        if let Ipv6::Stateful(firewall) = &mut self.ipv6 {
            firewall.expire(now, budget);
        }
    }

    /// An ICMP error from the inside about an answer it received (a port unreachable from
    /// the host, a time exceeded from a router inside): it leaves from the external
    /// address, and its quote is the answer as it was sent, to the external address and
    /// port.
    fn error_out(&mut self, data: &mut [u8], d: &mut PacketDesc) -> Verdict {
        let Some(inside) = quoted_connection(&d.parsed, data) else {
            return Verdict::Drop(UNSUPPORTED);
        };
        let Some(id) = self.translations.lookup(&inside, d.ts_ns) else {
            return Verdict::Drop(NO_TRANSLATION);
        };
        let port = self.translations.value(id).external_port;
        let external = self.external;
        let edits = edit::set_quoted_endpoint(data, &d.parsed, Side::Dst, v4(&external), port)
            .and_then(|()| edit::set_ip_addr(data, &d.parsed, Side::Src, &external[..4]));
        d.parsed.key.src = external;
        self.verdict(edits, self.outside)
    }

    /// An ICMP error from the outside about a packet that left translated (fragmentation
    /// needed, a port unreachable, a time exceeded): it reaches the inside host, and its
    /// quote is the packet as that host sent it.
    fn error_in(&mut self, data: &mut [u8], d: &mut PacketDesc) -> Verdict {
        let Some(answer) = quoted_connection(&d.parsed, data) else {
            return Verdict::Drop(UNSUPPORTED);
        };
        let inside = match self.answers.get(&answer).copied() {
            Some(inside) if self.translations.lookup(&inside, d.ts_ns).is_some() => inside,
            _ => return Verdict::Drop(NO_TRANSLATION),
        };
        let host = v4(&inside.src);
        let edits = edit::set_quoted_endpoint(data, &d.parsed, Side::Src, host, inside.src_port)
            .and_then(|()| edit::set_ip_addr(data, &d.parsed, Side::Dst, &host));
        d.parsed.key.dst = inside.src;
        self.verdict(edits, self.inside)
    }

    /// Forwards to `port` a packet whose edits were made; drops one they could not be.
    fn verdict(&self, edits: Result<(), EditError>, port: PortId) -> Verdict {
        match edits {
            Ok(()) => Verdict::Forward(port),
            Err(EditError::NoQuote) => Verdict::Drop(UNSUPPORTED),
            Err(_) => Verdict::Drop(TRUNCATED),
        }
    }

    /// The table key of a packet `nat` translates (its connection's from the inside,
    /// its answer's from the outside), and whether it came from the inside; `None` for
    /// one it passes or drops as it is.
    fn translated_key(&self, d: &PacketDesc, data: &[u8]) -> Option<(FlowKey, bool)> {
        let out = d.in_port == self.inside;
        let key = &d.parsed.key;
        // From the outside, only answers to the external address are translated.
        let answer = d.in_port == self.outside && key.dst == self.external;
        let translated = (out || answer) && key.ip_version == 4;
        (translated && translatable(&d.parsed, data, out).is_ok()).then(|| (table_key(key), out))
    }

    /// Makes the translation of `inside` the one the store holds (`None`: none), with
    /// its answer entry. Refused (`false`, nothing changed) when the table has no room, or
    /// when the answer entry is another connection's here (switches sharing a store must
    /// take their ports from pools apart).
    fn install(&mut self, inside: FlowKey, state: Option<&[u8]>, now: u64) -> bool {
        let before = self.translations.get(&inside).copied();
        let external = self.external;
        let answer_of = |t: &Translation| answer_key(&inside, external, t.external_port);
        let Some(state) = state.filter(|s| !s.is_empty()) else {
            if let Some(t) = before {
                self.remove(&inside, t.external_port);
            }
            return true;
        };
        if !self
            .translations
            .install_replicated(inside, Some(state), now)
        {
            return false;
        }
        let Some(t) = self.translations.get(&inside).copied() else {
            return false;
        };
        let answer = answer_of(&t);
        if self.answers.get(&answer).is_some_and(|k| *k != inside) {
            // Put back what was here.
            match (before, self.translations.find_id(&inside)) {
                (Some(b), Some(id)) => {
                    let _ = self.translations.set_profile(id, b.state as u8, now);
                    *self.translations.value_mut(id) = b;
                }
                _ => {
                    self.translations.delete(&inside);
                }
            }
            return false;
        }
        if let Some(old) = before.filter(|b| b.external_port != t.external_port) {
            self.answers.delete(&answer_of(&old));
        }
        if self.answers.get(&answer).is_none() && self.answers.add(answer, inside, now).is_err() {
            self.translations.delete(&inside);
            return false;
        }
        true
    }

    /// Looks at `budget` slots for translations idle past their state's timeout.
    fn expire(&mut self, now: u64, budget: usize) {
        let (answers, expired, external) = (&mut self.answers, &mut self.expired, self.external);
        self.translations.expire(now, budget, |key, t| {
            expired[t.state as usize] += 1;
            answers.delete(&answer_key(key, external, t.external_port));
        });
    }
}

/// Parses a port pool, `first-last` (or one port).
fn parse_pool(field: &str, text: &str) -> Result<(u16, u16), ConfigError> {
    let bad = || {
        ConfigError::new(
            field,
            format!("'{text}' is not a range of ports like 1024-65535 (first at least 1)"),
        )
    };
    let (a, b) = text.split_once('-').unwrap_or((text, text));
    let first: u16 = a.trim().parse().map_err(|_| bad())?;
    let last: u16 = b.trim().parse().map_err(|_| bad())?;
    if first == 0 || last < first {
        return Err(bad());
    }
    Ok((first, last))
}

impl Program for Nat {
    type Prepared = ();

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        let n = burst.len();
        for p in burst.iter_mut() {
            let d = p.desc;
            d.verdict = if d.in_port == self.inside {
                self.outbound(p.data, d, ctx)
            } else if d.in_port == self.outside {
                self.inbound(p.data, d, ctx.by_hash)
            } else {
                Verdict::Drop(OTHER_PORT)
            };
        }
        self.expire_all(ctx.now_ns, crate::sweep_budget(n));
    }

    /// Idle live ports still time translations out.
    fn poll(&mut self, _out: &mut Burst, ctx: &mut Context) {
        self.expire_all(ctx.now_ns, crate::IDLE_SWEEP);
    }

    /// Answers reach the worker that holds their translation when live ports spread
    /// packets by the remote address (`steering`), or, offline, when the runtime's flow
    /// hash spreads them and the external port is chosen for it: so not offline for a
    /// forwarded port (fixed). Nor, anywhere, under endpoint-independent mapping (one port
    /// for every remote) or replication (a connection is the flow of the switch that
    /// chose its port).
    fn check_workers(&self, workers: usize, live: bool) -> Result<(), String> {
        let why = if self.translations.replicated() {
            "replicated, a connection is one worker's flow, and its answers reach the worker \
             that took it only on the switch that chose its port"
        } else if !live && !self.forwards.is_empty() {
            "a forwarded port is fixed, so its connections' two directions may reach different workers"
        } else if self.answers.mappings.is_some() {
            "under endpoint-independent mapping an endpoint's port serves every destination, \
             and the runtime's flow hash sends answers from different destinations to \
             different workers"
        } else if self.answers.blocks.is_some() {
            "a host's port blocks are its alone, and workers that each hand out blocks would \
             hand one block to several hosts"
        } else {
            return Ok(());
        };
        if workers > 1 {
            return Err(format!(
                "nat runs on one worker here: {why}; with {workers}, answers would be dropped as no_translation; set workers = 1 (--workers 1)"
            ));
        }
        Ok(())
    }

    /// Live ports spread by the remote address: every packet to and from one remote host,
    /// and the ICMP errors about them, reaches the worker that holds their translations.
    fn steering(&self, port: PortId) -> Steering {
        if port == self.inside {
            Steering::RemoteIsDestination
        } else if port == self.outside {
            Steering::RemoteIsSource
        } else {
            Steering::Flow
        }
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &[
            "no_translation",
            "ports_exhausted",
            "table_full",
            "unsupported",
            "fragment",
            "truncated",
            "other_port",
            "unsolicited",
            "invalid",
            "unrelated_icmp",
            "out_of_window",
            "ipv6",
            "hairpin_unknown",
            "block_limit",
        ]
    }

    fn declarations(&self) -> Vec<Declaration> {
        vec![self.translations.declaration().clone()]
    }

    /// As `answer_by_table!`, and a translation the control plane deletes takes its
    /// answer entry with it (the table is read and delete only).
    fn control(
        &mut self,
        request: &Request,
        _prepared: Option<&std::sync::Arc<Self::Prepared>>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        let (answers, external) = (&mut self.answers, self.external);
        self.translations
            .answer_seeing_deletes(request, ctx.now_ns, |key, t| {
                answers.delete(&answer_key(key, external, t.external_port));
            })
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) {
        self.translations.take_notifications(out);
    }

    crate::synced_tables::synced_table_methods!(translations, after_commit: answer_again);

    /// `translations` replicated, each connection a flow with its answers' alias. Not
    /// with port forwards, nor with filtering that lets packets in: there a first packet
    /// from the outside makes a translation, which a switch that knows no flow by that
    /// packet could make without the store's lease. Nor with port blocks: each switch
    /// would hand out its blocks to its own hosts, and a connection moving to another
    /// switch would bring its port into a block held there by another host.
    fn replicate(&mut self, name: &str) -> bool {
        self.forwards.is_empty()
            && self.answers.filtering == Filtering::AddressAndPortDependent
            && self.answers.blocks.is_none()
            && self.translations.replicate(name, false)
    }

    /// A packet from the inside: its connection. An answer: the connection of its
    /// translation here (one with none here names it by alias).
    fn replicated_key(&self, d: &PacketDesc, data: &[u8]) -> Option<FlowBytes> {
        if !self.translations.replicated() {
            return None;
        }
        let (key, out) = self.translated_key(d, data)?;
        let inside = if out { key } else { *self.answers.get(&key)? };
        replicated::connection(&inside)
    }

    fn replicated_alias(&self, d: &PacketDesc, data: &[u8]) -> Option<FlowBytes> {
        if !self.translations.replicated() {
            return None;
        }
        match self.translated_key(d, data)? {
            (answer, false) if self.answers.get(&answer).is_none() => replicated::answer(&answer),
            _ => None,
        }
    }

    crate::replicated_tables::leased_table_methods!(
        translations,
        key_of_flow: replicated::inside_of,
        flow_of_key: replicated::connection
    );

    fn replicated_alias_of(&self, flow: &FlowBytes) -> Option<FlowBytes> {
        let inside = replicated::inside_of(flow)?;
        let t = self.translations.get(&inside)?;
        replicated::answer(&answer_key(&inside, self.external, t.external_port))
    }

    fn replicated_state(&self, flow: &FlowBytes) -> Option<Vec<u8>> {
        stateplane_runtime::state_alone(|out, hint| self.replicated_state_into(flow, out, hint))
    }

    fn replicated_state_into(
        &self,
        flow: &FlowBytes,
        out: &mut Vec<u8>,
        hint: &mut u32,
    ) -> Option<u64> {
        let inside = replicated::inside_of(flow)?;
        self.translations.replicated_state_into(&inside, out, hint)
    }

    fn install_replicated(&mut self, flow: &FlowBytes, state: Option<&[u8]>, now_ns: u64) -> bool {
        replicated::inside_of(flow).is_some_and(|inside| self.install(inside, state, now_ns))
    }

    /// Translations stay while the external address does (see `inherit_translations`);
    /// IPv6 connections stay while `ipv6` stays "stateful". The counts go on.
    fn inherit(&mut self, mut old: Self, now_ns: u64) -> Vec<Carried> {
        let mut carried = vec![self.inherit_translations(&mut old, now_ns)];
        match (&mut self.ipv6, old.ipv6) {
            (Ipv6::Stateful(new), Ipv6::Stateful(mut old)) => {
                let mut connections = new.inherit_connections(&mut old);
                connections.name = format!("ipv6 {}", connections.name);
                carried.push(connections);
            }
            (_, Ipv6::Stateful(_)) => carried.push(Carried::afresh(
                "ipv6 connections",
                "ipv6 is no longer \"stateful\"",
            )),
            _ => {}
        }
        self.created += old.created;
        self.neighbors = old.neighbors;
        for (new, old) in self.expired.iter_mut().zip(old.expired) {
            *new += old;
        }
        self.port_probes += old.port_probes;
        carried
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{ctx, hasher, ipv4_checksums_valid, tcp};
    use stateplane_gen::build::L4;
    use stateplane_state::KeyFields;
    use stateplane_state::control::Write;
    use stateplane_wire::parse;

    const S: u64 = 1_000_000_000;
    const INSIDE: &str = "198.18.0.1";
    const REMOTE: &str = "198.19.0.2";
    const EXTERNAL: &str = "198.18.255.1";

    fn nat(extra: &str) -> Nat {
        nat_at(EXTERNAL, extra)
    }

    fn nat_at(external: &str, extra: &str) -> Nat {
        let names = PortNames(vec!["inside".into(), "outside".into(), "other".into()]);
        let cfg: NatConfig = toml::from_str(&format!(
            "external = \"{external}\"\ninside = \"inside\"\noutside = \"outside\"\n{extra}"
        ))
        .unwrap();
        Nat::new(&cfg, &names, "program.nat", 9).unwrap()
    }

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    fn frame(src: &str, dst: &str, l4: L4) -> Vec<u8> {
        crate::testutil::ip_frame(src, dst, l4)
    }

    fn run_as(
        n: &mut Nat,
        t: u64,
        frames: &[(Vec<u8>, PortId)],
        worker: usize,
        workers: usize,
    ) -> Vec<(Verdict, Vec<u8>)> {
        crate::testutil::run_at(n, t, frames, (worker, workers), 3)
    }

    fn run(n: &mut Nat, t: u64, frames: &[(Vec<u8>, PortId)]) -> Vec<(Verdict, Vec<u8>)> {
        run_as(n, t, frames, 0, 1)
    }

    fn one(n: &mut Nat, t: u64, f: Vec<u8>, port: PortId) -> (Verdict, FlowKey, Vec<u8>) {
        let (v, bytes) = run(n, t, &[(f, port)]).remove(0);
        let key = parse(&bytes, port, &hasher()).unwrap().key;
        (v, key, bytes)
    }

    const OUT: Verdict = Verdict::Forward(1);
    const IN: Verdict = Verdict::Forward(0);

    /// The table key of a connection from INSIDE to REMOTE.
    fn inside_key(proto: u8, src_port: u16, dst_port: u16) -> FlowKey {
        let (inside, remote) = (INSIDE.parse().unwrap(), REMOTE.parse().unwrap());
        FlowKey::v4(inside, remote, proto, src_port, dst_port)
    }

    fn addr(key: &FlowKey, src: bool) -> std::net::IpAddr {
        if src { key.src_ip() } else { key.dst_ip() }.unwrap()
    }

    /// Synced, a NAT's translations move into another switch with the same external
    /// address (another hash seed): there the answers to the moved connections reach
    /// their inside hosts, a moved translation whose answer clashes with one of the
    /// switch's own connections is refused (the switch's own goes on, and the copy never
    /// holds the refused one), and a new connection does not take a port
    /// the moved ones hold towards its destination.
    #[test]
    fn synced_translations_move_to_another_switch_and_answers_find_them() {
        let syn = |inside: &str, p: u16| (frame(inside, REMOTE, tcp(p, 80, flags::SYN)), 0);
        let answer = |port: u16| {
            let f = frame(REMOTE, EXTERNAL, tcp(80, port, flags::SYN | flags::ACK));
            (f, 1)
        };
        // A slot: action (the connection's state), key (8 words), external port, packets
        // out and in.
        let stride = 1 + 8 + 3;
        let mut a = nat("");
        let slots = a.translations.slot_count() as u32;
        assert_eq!(
            Program::track(&mut a, "translations", 0),
            Some(slots * stride)
        );
        let moved: Vec<(Verdict, Vec<u8>)> = run(
            &mut a,
            S,
            &(50_000..50_004).map(|p| syn(INSIDE, p)).collect::<Vec<_>>(),
        );
        assert!(moved.iter().all(|(v, _)| *v == OUT));
        let cfg: NatConfig = toml::from_str(&format!(
            "external = \"{EXTERNAL}\"\ninside = \"inside\"\noutside = \"outside\""
        ))
        .unwrap();
        let names = PortNames(vec!["inside".into(), "outside".into(), "other".into()]);
        let mut b = Nat::new(&cfg, &names, "program.nat", 77).unwrap();
        Program::track(&mut b, "translations", 0);
        let (v, own, _) = one(&mut b, S, syn("198.18.0.7", 50_000).0, 0);
        assert_eq!((v, own.src_port), (OUT, 50_000));
        assert_eq!(
            crate::testutil::move_synced_table(&mut a, &mut b, stride),
            (4, 1),
            "the one clashing with the switch's own is refused"
        );
        assert_eq!(b.len(), 4);
        let mut changes = Vec::new();
        assert!(b.changes(&mut changes, usize::MAX));
        let occupied = changes
            .iter()
            .filter(|c| c.index % stride == 0 && c.new != 0);
        assert_eq!(
            occupied.count(),
            4,
            "the refused one never reaches the copy"
        );
        let answers = run(
            &mut b,
            2 * S,
            &(50_000..50_004).map(answer).collect::<Vec<_>>(),
        );
        let to = |bytes: &[u8]| addr(&parse(bytes, 1, &hasher()).unwrap().key, false);
        assert_eq!(
            to(&answers[0].1),
            ip("198.18.0.7"),
            "the switch's own goes on"
        );
        for (v, bytes) in &answers[1..] {
            assert_eq!((*v, to(bytes)), (IN, ip(INSIDE)), "a moved connection");
        }
        let (v, fresh, _) = one(&mut b, 2 * S, syn("198.18.0.9", 50_001).0, 0);
        assert_eq!(v, OUT);
        assert_ne!(fresh.src_port, 50_001, "held by a moved translation");
    }

    /// A reload keeps every translation while the external address stays: answers still
    /// reach the inside host and its packets keep their ports, under a new pool (whose
    /// ports new connections then take) and under a smaller capacity (as many as it
    /// holds: the others' answers are unknown); none under a new external address. IPv6
    /// connections stay while `ipv6` stays "stateful". What came across is said.
    #[test]
    fn a_reload_keeps_translations_while_the_external_address_stays() {
        let syn = |p: u16| frame(INSIDE, REMOTE, tcp(p, 80, flags::SYN));
        let answer = |port: u16| frame(REMOTE, EXTERNAL, tcp(80, port, flags::SYN | flags::ACK));
        let v6 = |inside: bool| match inside {
            true => (
                frame("2001:2::1", "2001:2::2", tcp(4000, 80, flags::SYN)),
                0,
            ),
            false => (
                frame("2001:2::2", "2001:2::1", tcp(80, 4000, flags::ACK)),
                1,
            ),
        };
        let pool = "ports = \"40000-40100\"";
        for (external, config, kept) in [
            (EXTERNAL, pool, 8),
            (EXTERNAL, "ports = \"20000-20010\"", 8),
            (EXTERNAL, "capacity = 5", 5),
            ("198.18.255.2", pool, 0),
        ] {
            let mut old = nat(pool);
            let ports: Vec<u16> = (50_000..50_008)
                .map(|p| one(&mut old, S, syn(p), 0))
                .inspect(|(v, _, _)| assert_eq!(*v, OUT))
                .map(|(_, key, _)| key.src_port)
                .collect();
            assert_eq!(run(&mut old, S, &[v6(true)])[0].0, OUT);
            let mut new = nat_at(external, config);
            let carried = Program::inherit(&mut new, old, 2 * S);
            assert_eq!(carried.len(), 2, "{config}: {carried:?}");
            assert_eq!(carried[0].kept, kept, "{config}: {}", carried[0]);
            assert_eq!(carried[0].lost(), kept < 8, "{config}: {}", carried[0]);
            assert_eq!(carried[1].to_string(), "ipv6 connections: kept 1 entries");
            assert_eq!(new.len() as u64, kept);
            let answered: Vec<u16> = (ports.iter().copied())
                .filter(|&port| one(&mut new, 2 * S, answer(port), 1).0 == IN)
                .collect();
            assert_eq!(answered.len() as u64, kept, "{config}");
            for (p, &port) in (50_000..).zip(&ports) {
                let (v, key, _) = one(&mut new, 2 * S, syn(p), 0);
                if answered.contains(&port) {
                    assert_eq!((v, key.src_port), (OUT, port), "{config}: kept its port");
                }
            }
            assert_eq!(run(&mut new, 2 * S, &[v6(false)])[0].0, IN, "{config}");
            if config.contains("20000") {
                let (_, key, _) = one(&mut new, 2 * S, syn(60_000), 0);
                assert!(
                    (20_000..=20_010).contains(&key.src_port),
                    "{}",
                    key.src_port
                );
            }
        }
        let mut new = nat("ipv6 = \"pass\"");
        let carried = Program::inherit(&mut new, nat(""), S);
        assert_eq!(
            carried[1].to_string(),
            "ipv6 connections: starts afresh (ipv6 is no longer \"stateful\")"
        );
        let carried = Program::inherit(&mut nat_at("198.18.255.2", ""), nat(""), S);
        assert_eq!(
            carried[0].to_string(),
            "translations: starts afresh (the external address changed from 198.18.255.1 \
             to 198.18.255.2)"
        );
    }

    /// One packet through `n` at `S`, its lease checked at `check`
    /// (`PacketDesc::lease_check`): its verdict.
    fn one_checked(n: &mut Nat, f: &[u8], port: PortId, check: Option<u16>) -> Verdict {
        let mut b = Burst::with_capacity(1);
        b.push(f, f.len() as u32, S, port, 0);
        b.now_ns = S;
        b.parse(&hasher());
        b.descs_mut()[0].lease_check = check;
        n.process(&mut b, &mut ctx(S, 3));
        b.descs()[0].verdict
    }

    /// Checking leases, `nat` translates a packet the stage did not admit only under its
    /// translation's mark: a new connection, a translation unmarked, and an answer whose
    /// translation is not here (the stage's to find by its alias) are left as they came,
    /// with no port taken. Under the mark both ways go through, and what was found comes
    /// back as the inside connection's flow with each packet's place, changed where the
    /// translation's replicated state moved (the answer establishing it, a RST removing
    /// it). An answer to nothing that the stage admitted is dropped as before.
    #[test]
    fn a_translation_checked_for_its_lease_goes_under_its_mark_and_tells_its_changes() {
        let mut n = nat("ports = \"40000-40010\"");
        assert!(!n.check_leases(), "not replicated");
        assert!(n.replicate("translations"));
        assert!(n.check_leases());
        let syn = frame(INSIDE, REMOTE, tcp(40_000, 80, flags::SYN));
        let (flow, _) = crate::testutil::replicated_names(&n, &syn, 0);
        let flow = flow.unwrap();
        let left = Verdict::Drop(DropReason::NOT_LEASED);
        assert_eq!(one_checked(&mut n, &syn, 0, Some(0)), left);
        assert!(n.is_empty(), "a new connection waits for its lease");
        assert_eq!(one_checked(&mut n, &syn, 0, None), OUT, "admitted");
        assert_eq!(n.len(), 1);
        assert_eq!(one_checked(&mut n, &syn, 0, Some(0)), left, "no mark");

        let port = n.translations.get(&table_key(&inside_key(TCP, 40_000, 80)));
        let port = port.unwrap().external_port;
        let from_remote = |l4| {
            let mut f = frame(REMOTE, EXTERNAL, l4);
            let mut p = parse(&f, 1, &hasher()).unwrap();
            let dst = p.key.dst;
            rewrite(&mut f, &mut p, Side::Dst, dst, port).unwrap();
            f
        };
        let answer = from_remote(tcp(80, 40_000, flags::SYN | flags::ACK));
        let elsewhere = frame(REMOTE, EXTERNAL, tcp(80, 45_000, flags::ACK));
        assert_eq!(one_checked(&mut n, &answer, 1, Some(0)), left, "no mark");
        assert_eq!(
            one_checked(&mut n, &elsewhere, 1, Some(0)),
            left,
            "an answer to a translation not here"
        );
        let no_translation = Verdict::Drop(NO_TRANSLATION);
        assert_eq!(one_checked(&mut n, &elsewhere, 1, None), no_translation);

        n.set_lease_clock(S);
        n.mark_leased(&flow, Some(2 * S));
        let mut found = Vec::new();
        assert_eq!(one_checked(&mut n, &syn, 0, Some(3)), OUT);
        assert_eq!(n.take_leased_changes(false, &mut found), 1);
        assert!(found.is_empty(), "a count is no change: {found:?}");
        assert_eq!(one_checked(&mut n, &answer, 1, Some(5)), IN);
        let as_found = |place, changed| stateplane_runtime::LeasedPacket {
            flow,
            place,
            changed,
        };
        assert_eq!(n.take_leased_changes(false, &mut found), 1);
        assert_eq!(found, [as_found(5, true)], "the answer established it");
        found.clear();
        let reset = from_remote(tcp(80, 40_000, flags::RST));
        assert_eq!(one_checked(&mut n, &reset, 1, Some(2)), IN);
        assert_eq!(n.take_leased_changes(false, &mut found), 1);
        assert_eq!(found, [as_found(2, true)], "a RST removed it");
        assert!(n.is_empty());
        assert_eq!(
            one_checked(&mut n, &syn, 0, Some(0)),
            left,
            "gone, mark and all"
        );
    }

    /// Replicated, a translation moves to another switch with its answers' way back:
    /// there an answer names its connection by an alias (the one written with it), and
    /// once installed, answers come back to the inside host and the inside's packets go
    /// out on the port the first switch chose, not one of its own pool's. A state
    /// withdrawn takes the answer entry with it; one whose answers another connection
    /// has here is refused, nothing changed.
    #[test]
    fn a_replicated_translation_moves_with_the_alias_of_its_answers() {
        for (out, back) in [
            (
                tcp(40_000, 80, flags::SYN),
                tcp(80, 40_000, flags::SYN | flags::ACK),
            ),
            (
                L4::IcmpEcho {
                    request: true,
                    ident: 0x77,
                    seq: 1,
                },
                L4::IcmpEcho {
                    request: false,
                    ident: 0x77,
                    seq: 1,
                },
            ),
        ] {
            let (mut a, mut b) = (
                nat("ports = \"40000-40010\""),
                nat("ports = \"50000-50010\""),
            );
            assert!(a.replicate("translations") && b.replicate("translations"));
            assert!(!nat("").replicate("answers"));
            let syn = frame(INSIDE, REMOTE, out);
            let (v, went, _) = one(&mut a, S, syn.clone(), 0);
            assert_eq!(v, OUT);
            let answer = frame(REMOTE, EXTERNAL, back);
            let answer = {
                // Addressed to the port (identifier) the connection went out on.
                let mut f = answer;
                let mut p = parse(&f, 1, &hasher()).unwrap();
                let dst = p.key.dst;
                rewrite(&mut f, &mut p, Side::Dst, dst, went.src_port).unwrap();
                f
            };
            let (flow, none) = crate::testutil::replicated_names(&a, &syn, 0);
            let flow = flow.unwrap();
            assert_eq!(none, None, "a packet that names its flow has no alias");
            assert_eq!(
                crate::testutil::replicated_names(&a, &answer, 1),
                (Some(flow), None),
                "both ways one flow"
            );
            let alias = a.replicated_alias_of(&flow).unwrap();
            assert_eq!(alias.tag(), flow.tag(), "one slot for both");
            assert_ne!(alias, flow);
            let state = a.replicated_state(&flow).unwrap();

            assert_eq!(
                crate::testutil::replicated_names(&b, &answer, 1),
                (None, Some(alias))
            );
            assert!(b.install_replicated(&flow, Some(&state), S));
            assert_eq!(
                crate::testutil::replicated_names(&b, &answer, 1),
                (Some(flow), None)
            );
            let (v, restored, _) = one(&mut b, S, answer.clone(), 1);
            assert_eq!(v, IN);
            assert_eq!(addr(&restored, false), ip(INSIDE));
            let (v, again, _) = one(&mut b, S, syn.clone(), 0);
            assert_eq!((v, again.src_port), (OUT, went.src_port), "A's port");
            assert!(b.replicated_state(&flow).is_some());

            // Withdrawn: the answers find nothing here again.
            assert!(b.install_replicated(&flow, None, S));
            assert_eq!(
                crate::testutil::replicated_names(&b, &answer, 1),
                (None, Some(alias))
            );
            assert_eq!(
                one(&mut b, S, answer.clone(), 1).0,
                Verdict::Drop(NO_TRANSLATION)
            );
            assert!(b.is_empty());

            // A switch where another connection has those answers refuses the state.
            let mut c = nat("ports = \"40000-40010\"");
            assert!(c.replicate("translations"));
            let other = frame("198.18.0.2", REMOTE, out);
            let (_, took, _) = one(&mut c, S, other, 0);
            assert_eq!(
                took.src_port, went.src_port,
                "the same port, from a pool not apart"
            );
            assert!(!c.install_replicated(&flow, Some(&state), S));
            assert_eq!(c.len(), 1);
            assert_eq!(
                crate::testutil::replicated_names(&c, &answer, 1)
                    .0
                    .map(|f| f == flow),
                Some(false)
            );
            assert!(
                !c.install_replicated(&alias, Some(&state), S),
                "an alias holds no state"
            );
        }
        // Not with port forwards: their first packets make state from the outside.
        let mut f = nat("forwards = [{ proto = \"tcp\", port = 80, to = \"198.18.0.9\" }]");
        assert!(!f.replicate("translations"));
        let mut open = nat(&format!("{EIM}\nfiltering = \"address_dependent\""));
        assert!(!open.replicate("translations"));
        assert!(nat(EIM).replicate("translations"));
        let one_worker = nat("");
        let mut replicated = nat("");
        assert!(replicated.replicate("translations"));
        assert!(one_worker.check_workers(2, false).is_ok());
        let refused = nat(EIM).check_workers(2, false).unwrap_err();
        assert!(
            refused.contains("endpoint-independent mapping"),
            "{refused}"
        );
        assert!(nat(EIM).check_workers(1, false).is_ok());
        // Live ports spread by the remote address, as `steering` asks: there a forwarded
        // port's connection (its client is the remote) stays on one worker too.
        let forwarding = nat("forwards = [{ proto = \"tcp\", port = 80, to = \"198.18.0.9\" }]");
        assert!(forwarding.check_workers(2, false).is_err());
        assert!(forwarding.check_workers(2, true).is_ok());
        assert!(one_worker.check_workers(2, true).is_ok());
        assert!(nat(EIM).check_workers(2, true).is_err());
        // A host's blocks are one worker's to hand out; nor can they be replicated.
        let mut blocks = nat("port_block = 64");
        let refused = blocks.check_workers(2, true).unwrap_err();
        assert!(refused.contains("port blocks"), "{refused}");
        assert!(blocks.check_workers(1, true).is_ok());
        assert!(!blocks.replicate("translations"));
        assert_eq!(
            [0, 1, 2].map(|p| one_worker.steering(p)),
            [
                Steering::RemoteIsDestination,
                Steering::RemoteIsSource,
                Steering::Flow
            ]
        );
        assert!(
            replicated
                .check_workers(2, false)
                .unwrap_err()
                .contains("replicated")
        );
    }

    #[test]
    fn tcp_goes_out_as_the_external_address_and_answers_come_back_restored() {
        let mut n = nat("");
        let syn = frame(INSIDE, REMOTE, tcp(40_000, 80, flags::SYN));
        let (v, out, bytes) = one(&mut n, S, syn, 0);
        assert_eq!(v, OUT);
        assert_eq!(addr(&out, true), ip(EXTERNAL));
        assert_eq!(out.src_port, 40_000, "the inside port is kept when free");
        assert_eq!((addr(&out, false), out.dst_port), (ip(REMOTE), 80));
        assert!(ipv4_checksums_valid(&bytes), "checksums after translation");
        // The answer, to the external address, comes back to the inside host.
        let syn_ack = frame(REMOTE, EXTERNAL, tcp(80, 40_000, flags::SYN | flags::ACK));
        let (v, back, bytes) = one(&mut n, S + 1, syn_ack, 1);
        assert_eq!(v, IN);
        assert_eq!((addr(&back, false), back.dst_port), (ip(INSIDE), 40_000));
        assert_eq!((addr(&back, true), back.src_port), (ip(REMOTE), 80));
        assert!(ipv4_checksums_valid(&bytes));
        let key = inside_key(TCP, 40_000, 80);
        let t = n.translation_of(&key).unwrap();
        assert_eq!(t.state, NatState::TcpEstablished);
        assert_eq!((t.packets_out, t.packets_in), (1, 1));
    }

    #[test]
    fn udp_and_icmp_echo_are_translated_both_ways_and_the_key_follows_the_bytes() {
        let mut n = nat("");
        let udp = frame(
            INSIDE,
            REMOTE,
            L4::Udp {
                src_port: 5353,
                dst_port: 53,
            },
        );
        let ping = frame(
            INSIDE,
            REMOTE,
            L4::IcmpEcho {
                request: true,
                ident: 0x77,
                seq: 1,
            },
        );
        let out = run(&mut n, S, &[(udp, 0), (ping, 0)]);
        for (v, bytes) in &out {
            assert_eq!(*v, OUT);
            assert!(ipv4_checksums_valid(bytes));
            assert_eq!(
                addr(&parse(bytes, 0, &hasher()).unwrap().key, true),
                ip(EXTERNAL)
            );
        }
        let ident = parse(&out[1].1, 0, &hasher()).unwrap().key.src_port;
        let udp_back = frame(
            REMOTE,
            EXTERNAL,
            L4::Udp {
                src_port: 53,
                dst_port: 5353,
            },
        );
        let pong = frame(
            REMOTE,
            EXTERNAL,
            L4::IcmpEcho {
                request: false,
                ident,
                seq: 1,
            },
        );
        let back = run(&mut n, S + 1, &[(udp_back, 1), (pong, 1)]);
        for (v, bytes) in &back {
            assert_eq!(*v, IN);
            assert!(ipv4_checksums_valid(bytes));
        }
        let udp_key = parse(&back[0].1, 1, &hasher()).unwrap().key;
        assert_eq!(
            (addr(&udp_key, false), udp_key.dst_port),
            (ip(INSIDE), 5353)
        );
        let pong_key = parse(&back[1].1, 1, &hasher()).unwrap().key;
        assert_eq!(
            (addr(&pong_key, false), pong_key.src_port),
            (ip(INSIDE), 0x77)
        );
        assert_eq!(n.len(), 2);
    }

    #[test]
    fn unsolicited_and_unsupported_packets_are_dropped_by_reason_and_others_pass() {
        let mut n = nat("");
        let drop = |r| Verdict::Drop(r);
        let cases = [
            // Nobody inside asked for it.
            (
                frame(REMOTE, EXTERNAL, tcp(80, 40_000, flags::SYN)),
                1,
                drop(NO_TRANSLATION),
            ),
            // Not to the external address.
            (
                frame(REMOTE, INSIDE, tcp(80, 40_000, flags::ACK)),
                1,
                drop(NO_TRANSLATION),
            ),
            // A reset of nothing would leak the inside address.
            (
                frame(INSIDE, REMOTE, tcp(1, 2, flags::RST)),
                0,
                drop(NO_TRANSLATION),
            ),
            // An echo reply from the inside is not a connection it opens.
            (
                frame(
                    INSIDE,
                    REMOTE,
                    L4::IcmpEcho {
                        request: false,
                        ident: 1,
                        seq: 1,
                    },
                ),
                0,
                drop(UNSUPPORTED),
            ),
            (
                frame(INSIDE, REMOTE, tcp(1, 2, flags::SYN)),
                2,
                drop(OTHER_PORT),
            ),
            // IPv6 is not translated: what the inside opens passes, with its answers.
            (
                frame("2001:2::1", "2001:2::2", tcp(1, 2, flags::SYN)),
                0,
                OUT,
            ),
            (
                frame("2001:2::2", "2001:2::1", tcp(2, 1, flags::SYN | flags::ACK)),
                1,
                IN,
            ),
        ];
        for (i, (f, port, want)) in cases.into_iter().enumerate() {
            assert_eq!(one(&mut n, S, f, port).0, want, "case {i}");
        }
        assert_eq!(n.len(), 0, "no translation made");
    }

    /// The packet an ICMP error (a frame) quotes, as a frame of its own, and its key.
    fn quote_of(error: &[u8]) -> (Vec<u8>, FlowKey) {
        let mut f = error[..14].to_vec();
        f.extend(&error[14 + 20 + 8..]);
        let key = icmp::quoted(&error[14 + 20 + 8..], false).unwrap().key;
        (f, key)
    }

    /// ICMP errors about translated connections are translated as the connections' own
    /// packets (RFC 5508): fragmentation needed from a router outside reaches the inside
    /// host about the segment it sent; a port unreachable from the inside host about a
    /// UDP answer leaves from the external address about the answer as it was sent; a
    /// time exceeded about a ping comes back with the inside identifier. Every checksum,
    /// the error's, the quoted IP header's and the quoted transport one, stays right, with
    /// a whole quote or 8 bytes; the errors move no translation's counts.
    #[test]
    fn icmp_errors_about_translated_connections_are_translated_with_their_quotes() {
        use crate::testutil::icmp_error_quoting;
        const ROUTER: &str = "198.19.0.9";
        let mut n = nat("");
        let syn = frame(INSIDE, REMOTE, tcp(40_000, 80, flags::SYN));
        let (_, _, sent) = one(&mut n, S, syn.clone(), 0);
        let udp = |src, dst, (src_port, dst_port)| frame(src, dst, L4::Udp { src_port, dst_port });
        let (_, out, _) = one(&mut n, S, udp(INSIDE, REMOTE, (5000, 53)), 0);
        let answer = udp(REMOTE, EXTERNAL, (53, out.src_port));
        let (v, _, delivered) = one(&mut n, S, answer.clone(), 1);
        assert_eq!(v, IN);
        let ping = L4::IcmpEcho {
            request: true,
            ident: 77,
            seq: 1,
        };
        let (_, ping_out, pinged) = one(&mut n, S, frame(INSIDE, REMOTE, ping), 0);
        let counts = |n: &Nat| {
            [(TCP, 40_000, 80), (UDP, 5000, 53), (ICMP, 77, 0)].map(|(proto, sp, dp)| {
                let t = n.translation_of(&inside_key(proto, sp, dp));
                t.map(|t| (t.packets_out, t.packets_in))
            })
        };
        let before = counts(&n);
        for quote in [8, 1000] {
            let need_frag = icmp_error_quoting(&sent, quote, ROUTER, EXTERNAL, (3, 4));
            let (v, key, bytes) = one(&mut n, S + 1, need_frag, 1);
            assert_eq!((v, addr(&key, false)), (IN, ip(INSIDE)), "quote {quote}");
            assert!(
                ipv4_checksums_valid(&bytes),
                "the error's checksums, quote {quote}"
            );
            let (quoted, inner) = quote_of(&bytes);
            assert_eq!(
                (
                    addr(&inner, true),
                    inner.src_port,
                    addr(&inner, false),
                    inner.dst_port
                ),
                (ip(INSIDE), 40_000, ip(REMOTE), 80),
                "the segment as the inside host sent it"
            );
            if quote == 1000 {
                assert_eq!(quoted, syn, "the whole segment as it was sent");
            }

            let unreachable = icmp_error_quoting(&delivered, quote, INSIDE, REMOTE, (3, 3));
            let (v, key, bytes) = one(&mut n, S + 1, unreachable, 0);
            assert_eq!((v, addr(&key, true)), (OUT, ip(EXTERNAL)), "quote {quote}");
            assert!(ipv4_checksums_valid(&bytes));
            let (quoted, _) = quote_of(&bytes);
            if quote == 1000 {
                assert_eq!(quoted, answer, "the answer as it was sent");
            } else {
                assert_eq!(quoted, answer[..quoted.len()]);
            }

            let exceeded = icmp_error_quoting(&pinged, quote, ROUTER, EXTERNAL, (11, 0));
            let (v, _, bytes) = one(&mut n, S + 1, exceeded, 1);
            assert_eq!(v, IN);
            assert!(ipv4_checksums_valid(&bytes));
            let inner = quote_of(&bytes).1;
            assert_ne!(ping_out.src_port, 77, "the identifier was translated");
            assert_eq!((addr(&inner, true), inner.src_port), (ip(INSIDE), 77));
        }
        assert_eq!(
            counts(&n),
            before,
            "errors count as no packet of their connection"
        );
    }

    /// Errors about no translation, or quoting what cannot be told, are dropped by reason.
    #[test]
    fn icmp_errors_about_nothing_translated_are_dropped_by_reason() {
        use crate::testutil::{icmp_error, icmp_error_quoting};
        let mut n = nat("");
        let (_, _, sent) = one(
            &mut n,
            S,
            frame(INSIDE, REMOTE, tcp(40_000, 80, flags::SYN)),
            0,
        );
        let other = frame(EXTERNAL, REMOTE, tcp(40_001, 80, flags::SYN));
        let stray = frame(REMOTE, INSIDE, tcp(80, 40_002, flags::ACK));
        let mut gre = sent.clone();
        gre[14 + 9] = 47;
        let drop = Verdict::Drop;
        let cases = [
            (
                icmp_error(&other, REMOTE, EXTERNAL, 3, 3),
                1,
                drop(NO_TRANSLATION),
            ),
            (
                icmp_error(&stray, INSIDE, REMOTE, 3, 3),
                0,
                drop(NO_TRANSLATION),
            ),
            (
                icmp_error_quoting(&sent, 4, REMOTE, EXTERNAL, (3, 4)),
                1,
                drop(UNSUPPORTED),
            ),
            (
                icmp_error(&gre, REMOTE, EXTERNAL, 3, 2),
                1,
                drop(UNSUPPORTED),
            ),
            (icmp_error(&sent, REMOTE, EXTERNAL, 3, 4), 1, IN),
        ];
        for (i, (f, port, want)) in cases.into_iter().enumerate() {
            assert_eq!(one(&mut n, S, f, port).0, want, "case {i}");
        }
        // Past the translation's timeout (TCP not answered: 240 s), its errors are too.
        let late = icmp_error(&sent, REMOTE, EXTERNAL, 3, 4);
        assert_eq!(one(&mut n, S + 241 * S, late, 1).0, drop(NO_TRANSLATION));
    }

    /// IPv6 is not translated; it passes as `ipv6` says: by default what the inside opens
    /// passes with its answers and nothing else comes in (neighbor discovery from the link
    /// aside), `pass` lets everything through, `drop` nothing.
    #[test]
    fn ipv6_goes_as_its_policy_says() {
        use crate::testutil::icmpv6;
        let (inside, remote) = ("2001:2::1", "2001:2::2");
        let udp = |from_inside: bool, port: u16| {
            let (src, dst) = if from_inside {
                (inside, remote)
            } else {
                (remote, inside)
            };
            let (src_port, dst_port) = if from_inside {
                (5000, port)
            } else {
                (port, 5000)
            };
            frame(src, dst, L4::Udp { src_port, dst_port })
        };
        let packets = || {
            [
                (frame(inside, remote, tcp(4000, 80, flags::SYN)), 0),
                (
                    frame(remote, inside, tcp(80, 4000, flags::SYN | flags::ACK)),
                    1,
                ),
                (udp(true, 53), 0),
                (udp(false, 53), 1),
                (frame(remote, inside, tcp(80, 4001, flags::SYN)), 1),
                (udp(false, 54), 1),
                (icmpv6(remote, inside, 136, 255), 1),
            ]
        };
        let drop = Verdict::Drop;
        let unsolicited = drop(UNSOLICITED);
        for (policy, want) in [
            ("", [OUT, IN, OUT, IN, unsolicited, unsolicited, IN]),
            (
                "ipv6 = \"stateful\"",
                [OUT, IN, OUT, IN, unsolicited, unsolicited, IN],
            ),
            ("ipv6 = \"pass\"", [OUT, IN, OUT, IN, IN, IN, IN]),
            ("ipv6 = \"drop\"", [drop(IPV6); 7]),
        ] {
            let mut n = nat(policy);
            let got: Vec<Verdict> = run(&mut n, S, &packets())
                .into_iter()
                .map(|(v, _)| v)
                .collect();
            assert_eq!(got, want, "{policy}");
            assert_eq!(n.len(), 0, "no translation: {policy}");
        }
        assert_eq!(nat("").drop_reasons()[11], "ipv6");
        // Connections age out as a firewall's do: the answer to a UDP exchange 121 s
        // later (udp_stream's 120 s) is unsolicited.
        let mut n = nat("");
        run(&mut n, S, &[(udp(true, 53), 0), (udp(false, 53), 1)]);
        assert_eq!(
            run(&mut n, S + 121 * S, &[(udp(false, 53), 1)])[0].0,
            unsolicited
        );
        // A full IPv6 table of answered connections (none of which gives way) refuses
        // the next one by name, and the ones it holds still pass.
        let mut n = nat("capacity = 4");
        let opened: Vec<Verdict> = (0..64)
            .map(|port| {
                let out = run(&mut n, S, &[(udp(true, 1000 + port), 0)])[0].0;
                run(&mut n, S, &[(udp(false, 1000 + port), 1)]);
                out
            })
            .collect();
        assert!(opened.contains(&drop(TABLE_FULL)), "{opened:?}");
        assert_eq!(n.drop_reasons()[2], "table_full");
        let first = opened.iter().position(|v| *v == OUT).unwrap() as u16;
        assert_eq!(run(&mut n, S, &[(udp(false, 1000 + first), 1)])[0].0, IN);
    }

    #[test]
    fn a_taken_port_moves_the_next_connection_and_an_exhausted_pool_drops() {
        let mut n = nat("ports = \"2000-2001\"");
        let from = |host: &str| frame(host, REMOTE, tcp(2000, 80, flags::SYN));
        let ports: Vec<_> = ["198.18.0.1", "198.18.0.2"]
            .iter()
            .map(|h| {
                let (v, k, _) = one(&mut n, S, from(h), 0);
                assert_eq!(v, OUT);
                k.src_port
            })
            .collect();
        assert_eq!(ports, [2000, 2001], "the second host cannot keep port 2000");
        assert_eq!(
            one(&mut n, S, from("198.18.0.3"), 0).0,
            Verdict::Drop(PORTS_EXHAUSTED)
        );
        // Another remote can reuse the ports: translations are per connection.
        let elsewhere = frame("198.18.0.3", "198.19.0.9", tcp(2000, 80, flags::SYN));
        assert_eq!(one(&mut n, S, elsewhere, 0).0, OUT);
    }

    const EIM: &str = "mapping = \"endpoint_independent\"";

    /// Under endpoint-independent mapping an inside endpoint keeps one external port for
    /// every destination, no other endpoint gets that port even for another destination
    /// (where a port per connection would share it), the pool runs out by endpoints, not
    /// connections, and a mapping lives as long as a translation uses it.
    #[test]
    fn endpoint_independent_mapping_gives_an_endpoint_one_port_for_every_destination() {
        let syn =
            |host: &str, remote: &str, port: u16| frame(host, remote, tcp(port, 80, flags::SYN));
        let port_of = |n: &mut Nat, f: Vec<u8>| {
            let (v, k, _) = one(n, S, f, 0);
            assert_eq!(v, OUT);
            k.src_port
        };
        for mapping in ["", EIM] {
            let mut n = nat(&format!("ports = \"2000-2003\"\n{mapping}"));
            // Three destinations from 198.18.0.1:3000 (outside the pool: a port is drawn).
            let first = port_of(&mut n, syn("198.18.0.1", "198.19.0.1", 3000));
            let again: Vec<u16> = ["198.19.0.2", "198.19.0.3"]
                .map(|r| port_of(&mut n, syn("198.18.0.1", r, 3000)))
                .into();
            // Another endpoint asking for that very port, to another destination.
            let other = port_of(&mut n, syn("198.18.0.2", "198.19.0.9", first));
            if mapping.is_empty() {
                assert_eq!(
                    other, first,
                    "a port per connection is shared across destinations"
                );
                continue;
            }
            assert_eq!(again, [first, first], "one port for every destination");
            assert_ne!(other, first, "an endpoint's port serves no other endpoint");
            // The pool runs out by endpoints: two more take the last two ports, a fifth
            // endpoint finds none, while the first opens its fourth connection.
            port_of(&mut n, syn("198.18.0.3", "198.19.0.1", 3000));
            port_of(&mut n, syn("198.18.0.4", "198.19.0.1", 3000));
            let fifth = syn("198.18.0.5", "198.19.0.1", 3000);
            assert_eq!(
                one(&mut n, S, fifth.clone(), 0).0,
                Verdict::Drop(PORTS_EXHAUSTED)
            );
            assert_eq!(
                port_of(&mut n, syn("198.18.0.1", "198.19.0.4", 3000)),
                first
            );
            // Once every translation of the first endpoint is reset, its port is free.
            for r in ["198.19.0.1", "198.19.0.2", "198.19.0.3", "198.19.0.4"] {
                let rst = frame("198.18.0.1", r, tcp(3000, 80, flags::RST));
                assert_eq!(one(&mut n, S, rst, 0).0, OUT);
            }
            assert_eq!(port_of(&mut n, fifth), first);
        }
    }

    /// Port-block allocation: a host's ports come from its blocks alone, a port of its
    /// blocks serving several destinations before it takes another block; at its limit
    /// of blocks it is refused as `block_limit` while other hosts go on; with every
    /// block held a new host is refused as `ports_exhausted`; a block whose last
    /// translation ends, by a RST or past its timeout, is free for another host.
    #[test]
    fn port_blocks_give_each_host_ports_of_its_own() {
        let udp = |src_port, dst_port| L4::Udp { src_port, dst_port };
        // Four blocks of 8 (2000-2031); ports 2032-2035 make no whole block.
        let mut n = nat(
            "ports = \"2000-2035\"\nport_block = 8\nblocks_per_host = 2\n\
             timeouts = { udp = 30 }",
        );
        let block_of = |port: u16| (port - 2000) / 8;
        let go = |n: &mut Nat, t: u64, host: &str, remote: &str, port: u16| {
            let (v, k, _) = one(n, t, frame(host, remote, udp(port, 53)), 0);
            (v, k.src_port)
        };
        // Host a: 8 connections to one destination fill its first block; the 9th takes a
        // second block, and a connection to another destination reuses the first.
        let a: Vec<u16> = (0..9)
            .map(|i| {
                let (v, port) = go(&mut n, S, "198.18.0.1", REMOTE, 40_000 + i);
                assert_eq!(v, OUT);
                port
            })
            .collect();
        let first = block_of(a[0]);
        assert!(a[..8].iter().all(|&p| block_of(p) == first), "{a:?}");
        assert_ne!(block_of(a[8]), first);
        assert!(a.iter().all(|&p| p < 2032), "{a:?}");
        let (v, other) = go(&mut n, S, "198.18.0.1", "198.19.0.9", 40_000);
        assert_eq!(v, OUT);
        assert_eq!(block_of(other), first, "a port serves several destinations");
        // Its own port is kept where its block is the host's.
        let own = 2000 + first * 8 + 3;
        assert_eq!(go(&mut n, S, "198.18.0.1", "198.19.0.8", own), (OUT, own));
        // Both its blocks full for REMOTE: the 17th connection there is refused by its
        // limit, not by the pool, which two other hosts then share.
        for i in 9..16 {
            assert_eq!(go(&mut n, S, "198.18.0.1", REMOTE, 40_000 + i).0, OUT);
        }
        let refused = go(&mut n, S, "198.18.0.1", REMOTE, 40_100);
        assert_eq!(refused.0, Verdict::Drop(BLOCK_LIMIT));
        let (v, b) = go(&mut n, S, "198.18.0.2", REMOTE, 2001);
        let (w, c) = go(&mut n, S, "198.18.0.3", REMOTE, 2001);
        assert_eq!((v, w), (OUT, OUT));
        let blocks_a = [first, block_of(a[8])];
        assert!(!blocks_a.contains(&block_of(b)) && !blocks_a.contains(&block_of(c)));
        assert_ne!(block_of(b), block_of(c), "a block is one host's");
        // Every block held: a fourth host finds none.
        let d = go(&mut n, S, "198.18.0.4", REMOTE, 40_000);
        assert_eq!(d.0, Verdict::Drop(PORTS_EXHAUSTED));
        // Host b's block frees when its translation times out; then the fourth host
        // takes it, and the ports it hands out are that block's.
        n.expire(20 * S, usize::MAX);
        assert_eq!(go(&mut n, 20 * S, "198.18.0.4", REMOTE, 40_000).0, d.0);
        n.expire(40 * S, usize::MAX);
        // Past the timeout every translation is gone, so every block is free.
        let blocks = n.answers.blocks.as_ref().unwrap();
        assert_eq!((blocks.in_use, blocks.of_host.len()), (0, 0));
        let (v, port) = go(&mut n, 40 * S, "198.18.0.4", REMOTE, 40_000);
        assert_eq!(v, OUT);
        assert!(port < 2032);
    }

    /// An echo's identifier is a port as any other here: it comes from its host's block,
    /// shared with the host's TCP and UDP connections (each protocol its own answers).
    #[test]
    fn echo_identifiers_come_from_the_hosts_block() {
        let mut n = nat("ports = \"6000-6015\"\nport_block = 8\nblocks_per_host = 1");
        let udp = frame(
            "198.18.0.1",
            REMOTE,
            L4::Udp {
                src_port: 9000,
                dst_port: 53,
            },
        );
        let (v, k, _) = one(&mut n, S, udp, 0);
        assert_eq!(v, OUT);
        let block = (k.src_port - 6000) / 8;
        for ident in [1, 2, 3] {
            let echo = L4::IcmpEcho {
                request: true,
                ident,
                seq: 1,
            };
            let (v, k, _) = one(&mut n, S, frame("198.18.0.1", REMOTE, echo), 0);
            assert_eq!(v, OUT);
            assert_eq!((k.src_port - 6000) / 8, block, "identifier {}", k.src_port);
        }
        // Another host's echo takes the other block.
        let echo = L4::IcmpEcho {
            request: true,
            ident: 1,
            seq: 1,
        };
        let (v, k, _) = one(&mut n, S, frame("198.18.0.2", REMOTE, echo), 0);
        assert_eq!(v, OUT);
        assert_ne!((k.src_port - 6000) / 8, block);
    }

    /// A block goes back with its last translation however that ends (here a TCP RST),
    /// and only then: a host keeps a block while one translation on it lives.
    #[test]
    fn a_block_is_free_once_its_last_translation_is_reset() {
        let syn = |host: &str, port| frame(host, REMOTE, tcp(port, 80, flags::SYN));
        let rst = |host: &str, port| frame(host, REMOTE, tcp(port, 80, flags::RST));
        let mut n = nat("ports = \"3000-3003\"\nport_block = 4\nblocks_per_host = 1");
        let (v, _, _) = one(&mut n, S, syn("198.18.0.1", 5000), 0);
        let (w, _, _) = one(&mut n, S, syn("198.18.0.1", 5001), 0);
        assert_eq!((v, w), (OUT, OUT));
        let other = || syn("198.18.0.2", 5000);
        assert_eq!(one(&mut n, S, other(), 0).0, Verdict::Drop(PORTS_EXHAUSTED));
        assert_eq!(one(&mut n, S, rst("198.18.0.1", 5000), 0).0, OUT);
        assert_eq!(one(&mut n, S, other(), 0).0, Verdict::Drop(PORTS_EXHAUSTED));
        assert_eq!(one(&mut n, S, rst("198.18.0.1", 5001), 0).0, OUT);
        let (v, k, _) = one(&mut n, S, other(), 0);
        assert_eq!(v, OUT);
        assert!((3000..3004).contains(&k.src_port));
    }

    /// Blocks under endpoint-independent mapping and port parity: an endpoint's one port
    /// is of its host's block, and of its inside port's parity.
    #[test]
    fn blocks_hold_mapped_ports_of_the_inside_ports_parity() {
        let udp = |src_port, dst_port| L4::Udp { src_port, dst_port };
        let mut n = nat(&format!(
            "{EIM}\nport_parity = true\nports = \"4000-4015\"\nport_block = 4\n\
             blocks_per_host = 4"
        ));
        let mut ports = HashMap::new();
        for (host, inside_port) in [
            ("198.18.0.1", 7001),
            ("198.18.0.1", 7002),
            ("198.18.0.2", 7003),
        ] {
            for remote in ["198.19.0.1", "198.19.0.2"] {
                let (v, k, _) = one(&mut n, S, frame(host, remote, udp(inside_port, 53)), 0);
                assert_eq!(v, OUT);
                assert_eq!(k.src_port & 1, inside_port & 1, "parity kept");
                let was = ports.insert((host, inside_port), k.src_port);
                assert!(was.is_none_or(|p| p == k.src_port), "one port per endpoint");
            }
        }
        let block = |p: u16| (p - 4000) / 4;
        let (one_a, two_a) = (ports[&("198.18.0.1", 7001)], ports[&("198.18.0.1", 7002)]);
        let b = ports[&("198.18.0.2", 7003)];
        assert_eq!(
            block(one_a),
            block(two_a),
            "one host, one block while it has room"
        );
        assert_ne!(block(b), block(one_a));
    }

    /// A reload keeps the blocks when their shape stays, and otherwise builds them from
    /// the translations it keeps: a host keeps its block, and another host's new
    /// connections take none of its ports.
    #[test]
    fn a_reload_keeps_or_builds_each_hosts_blocks() {
        let udp = |src_port, dst_port| L4::Udp { src_port, dst_port };
        let base = "ports = \"2000-2063\"\ntimeouts = { udp = 300 }";
        for (before, after) in [
            ("port_block = 16", "port_block = 16\nblocks_per_host = 1"),
            ("", "port_block = 16\nblocks_per_host = 1"),
            ("port_block = 8", "port_block = 16\nblocks_per_host = 1"),
        ] {
            let mut old = nat(&format!("{base}\n{before}"));
            let (v, k, _) = one(&mut old, S, frame("198.18.0.1", REMOTE, udp(2020, 53)), 0);
            assert_eq!((v, k.src_port), (OUT, 2020), "{before}");
            let mut n = nat(&format!("{base}\n{after}"));
            let carried = Program::inherit(&mut n, old, 2 * S);
            assert!(carried.iter().all(|c| !c.lost()), "{before}");
            // The host's block 1 (2016-2031) is its: a second connection there takes a
            // port of it, and its limit of one block refuses it once the block is full.
            let blocks = n.answers.blocks.as_ref().unwrap();
            assert_eq!(blocks.per_host, 1, "{before}");
            let mut theirs = vec![];
            for i in 0..16 {
                let f = frame("198.18.0.1", REMOTE, udp(41_000 + i, 53));
                theirs.push(one(&mut n, 2 * S, f, 0));
            }
            let taken: Vec<u16> = theirs
                .iter()
                .filter(|(v, ..)| *v == OUT)
                .map(|t| t.1.src_port)
                .collect();
            assert_eq!(taken.len(), 15, "{before}: the block's other ports");
            assert!(
                taken.iter().all(|p| (2016..2032).contains(p)),
                "{before}: {taken:?}"
            );
            assert_eq!(theirs[15].0, Verdict::Drop(BLOCK_LIMIT), "{before}");
            // Another host asking for 2020 gets none of block 1.
            let (v, k, _) = one(&mut n, 2 * S, frame("198.18.0.2", REMOTE, udp(2020, 53)), 0);
            assert_eq!(v, OUT);
            assert!(
                !(2016..2032).contains(&k.src_port),
                "{before}: {}",
                k.src_port
            );
        }
    }

    /// A mapping lives as long as its translations: past the UDP timeout they are swept
    /// and the port is another endpoint's to take; before it, it is not.
    #[test]
    fn a_mapping_ends_with_its_last_translation_timing_out() {
        let udp = |src_port, dst_port| L4::Udp { src_port, dst_port };
        let mut n = nat(&format!(
            "{EIM}\nports = \"2000-2999\"\ntimeouts = {{ udp = 30 }}"
        ));
        let (v, k, _) = one(&mut n, S, frame(INSIDE, REMOTE, udp(2500, 53)), 0);
        assert_eq!((v, k.src_port), (OUT, 2500));
        // Another endpoint asking for port 2500 gets another, while the mapping lives.
        let other = || frame("198.18.0.9", "198.19.0.9", udp(2500, 53));
        n.expire(20 * S, usize::MAX);
        let (_, k, _) = one(&mut n, 20 * S, other(), 0);
        assert_ne!(k.src_port, 2500);
        let taken = k.src_port;
        // Past the timeout both are swept; the port is free again.
        n.expire(60 * S, usize::MAX);
        assert!(n.answers.mappings.as_ref().unwrap().holder.is_empty());
        let again = frame("198.18.0.7", "198.19.0.9", udp(2500, 53));
        let (_, k, _) = one(&mut n, 60 * S, again, 0);
        assert_eq!(k.src_port, 2500);
        assert_ne!(taken, 2500);
    }

    /// What comes in to a mapped port, by filtering (RFC 4787 section 5): from the
    /// address and port the endpoint sent to (always), another port of that address
    /// (address-dependent and endpoint-independent), another address (endpoint-
    /// independent only). What comes in opens a translation to the endpoint, answered
    /// from its port; a TCP segment other than a SYN opens nothing.
    #[test]
    fn filtering_lets_in_what_it_says_to_the_mapped_endpoint() {
        let udp = |src_port, dst_port| L4::Udp { src_port, dst_port };
        let cases = [
            ("address_and_port_dependent", [true, false, false]),
            ("address_dependent", [true, true, false]),
            ("endpoint_independent", [true, true, true]),
        ];
        for (filtering, expected) in cases {
            let mut n = nat(&format!("{EIM}\nfiltering = \"{filtering}\""));
            let (v, k, _) = one(&mut n, S, frame(INSIDE, REMOTE, udp(5000, 3478)), 0);
            assert_eq!(v, OUT);
            let mapped = k.src_port;
            let senders = [(REMOTE, 3478), (REMOTE, 3479), ("198.19.0.77", 3478)];
            for ((host, port), expected) in senders.into_iter().zip(expected) {
                let (v, k, bytes) = one(&mut n, S, frame(host, EXTERNAL, udp(port, mapped)), 1);
                let came_in = v == IN;
                assert_eq!(came_in, expected, "{filtering}: from {host}:{port}");
                if !came_in {
                    assert_eq!(v, Verdict::Drop(NO_TRANSLATION));
                    continue;
                }
                assert_eq!((addr(&k, false), k.dst_port), (ip(INSIDE), 5000));
                assert!(ipv4_checksums_valid(&bytes));
                // The endpoint's answer leaves from its mapped port.
                let answer = frame(INSIDE, host, udp(5000, port));
                let (v, k, _) = one(&mut n, S, answer, 0);
                assert_eq!((v, addr(&k, true), k.src_port), (OUT, ip(EXTERNAL), mapped));
            }
            if filtering != "endpoint_independent" {
                continue;
            }
            // TCP: a SYN from anywhere opens; another segment does not.
            let (_, k, _) = one(
                &mut n,
                S,
                frame(INSIDE, REMOTE, tcp(6000, 80, flags::SYN)),
                0,
            );
            let tcp_mapped = k.src_port;
            let from_afar = |f| frame("198.19.0.88", EXTERNAL, tcp(443, tcp_mapped, f));
            assert_eq!(
                one(&mut n, S, from_afar(flags::ACK), 1).0,
                Verdict::Drop(NO_TRANSLATION)
            );
            let (v, k, _) = one(&mut n, S, from_afar(flags::SYN), 1);
            assert_eq!((v, k.dst_port), (IN, 6000));
            // A port no endpoint holds lets nothing in.
            let stray = frame("198.19.0.88", EXTERNAL, udp(1, mapped.wrapping_add(1)));
            assert_eq!(one(&mut n, S, stray, 1).0, Verdict::Drop(NO_TRANSLATION));
        }
    }

    /// A reload that turns endpoint-independent mapping on keeps the translations and
    /// builds the mappings from them: the endpoint's next connection takes its carried
    /// port; one that keeps it on carries the mappings whole, filtering included.
    #[test]
    fn a_reload_builds_mappings_from_the_translations_it_keeps() {
        let udp = |src_port, dst_port| L4::Udp { src_port, dst_port };
        // Inside ports outside the pool, so that ports are drawn, not kept.
        let pool = "ports = \"2000-2999\"";
        let mut before = nat(pool);
        let (_, k, _) = one(&mut before, S, frame(INSIDE, REMOTE, udp(5000, 53)), 0);
        let port = k.src_port;
        let eif = format!("{pool}\n{EIM}\nfiltering = \"endpoint_independent\"");
        for old in [before, nat(&eif)] {
            let mut old = old;
            if old.answers.mappings.is_some() {
                one(&mut old, S, frame(INSIDE, REMOTE, udp(5000, 53)), 0);
            }
            let mut n = nat(&eif);
            let carried = n.inherit(old, 2 * S);
            assert_eq!(carried[0].kept, 1, "{carried:?}");
            let elsewhere = frame(INSIDE, "198.19.0.66", udp(5000, 53));
            let (v, k, _) = one(&mut n, 2 * S, elsewhere, 0);
            assert_eq!((v, k.src_port), (OUT, port));
            let stranger = frame("198.19.0.99", EXTERNAL, udp(7, port));
            assert_eq!(one(&mut n, 2 * S, stranger, 1).0, IN);
        }
    }

    /// Hairpinning (RFC 4787 REQ-9, RFC 5382 REQ-8): an inside host reaches another's
    /// forwarded port by the external address. It arrives from the first host's external
    /// endpoint at the second host's MAC, from the MAC the first addressed; the answer
    /// comes back the same way, from the forwarded port. A host whose MAC the NAT has not
    /// seen (no ARP, no connection) is not reached; an echo to the external address is
    /// not answered.
    #[test]
    fn inside_hosts_reach_each_other_by_the_external_address() {
        let mut n = nat("ports = \"20000-65535\"\n\
             forwards = [{ proto = \"tcp\", port = 8080, to = \"198.18.0.2\", to_port = 80 }]");
        let (client, server) = ("198.18.0.1", "198.18.0.2");
        let (client_mac, server_mac, gateway_mac) = (
            [2, 0, 0, 0, 0, 0x0a],
            [2, 0, 0, 0, 0, 0x0b],
            [2, 0, 0, 0, 0, 0xfe],
        );
        let from = |mac: [u8; 6], mut f: Vec<u8>| {
            f[..6].copy_from_slice(&gateway_mac);
            f[6..12].copy_from_slice(&mac);
            f
        };
        let syn = from(
            client_mac,
            frame(client, EXTERNAL, tcp(40_000, 8080, flags::SYN)),
        );
        assert_eq!(
            one(&mut n, S, syn.clone(), 0).0,
            Verdict::Drop(HAIRPIN_UNKNOWN)
        );
        let arp = crate::testutil::arp_request(server_mac, [198, 18, 0, 2], [198, 18, 0, 254]);
        assert_eq!(one(&mut n, S, arp, 0).0, OUT);
        let (v, k, bytes) = one(&mut n, S, syn, 0);
        assert_eq!(v, IN, "back to the inside");
        assert_eq!((addr(&k, false), k.dst_port), (ip(server), 80));
        assert_eq!(addr(&k, true), ip(EXTERNAL));
        let client_port = k.src_port;
        assert_eq!(
            (&bytes[..6], &bytes[6..12]),
            (&server_mac[..], &gateway_mac[..])
        );
        assert!(ipv4_checksums_valid(&bytes));
        // The server answers the external endpoint it sees; the client gets it from 8080.
        let answer = from(
            server_mac,
            frame(
                server,
                EXTERNAL,
                tcp(80, client_port, flags::SYN | flags::ACK),
            ),
        );
        let (v, k, bytes) = one(&mut n, S, answer, 0);
        assert_eq!(v, IN);
        assert_eq!((addr(&k, true), k.src_port), (ip(EXTERNAL), 8080));
        assert_eq!((addr(&k, false), k.dst_port), (ip(client), 40_000));
        assert_eq!(
            (&bytes[..6], &bytes[6..12]),
            (&client_mac[..], &gateway_mac[..])
        );
        assert!(ipv4_checksums_valid(&bytes));
        // An unforwarded port of the external address reaches no one.
        let stray = from(
            client_mac,
            frame(client, EXTERNAL, tcp(40_001, 9999, flags::SYN)),
        );
        assert_eq!(one(&mut n, S, stray, 0).0, Verdict::Drop(NO_TRANSLATION));
        let echo = L4::IcmpEcho {
            request: true,
            ident: 7,
            seq: 1,
        };
        let ping = from(client_mac, frame(client, EXTERNAL, echo));
        assert_eq!(one(&mut n, S, ping, 0).0, Verdict::Drop(NO_TRANSLATION));
    }

    /// Two inside hosts that know each other's external endpoints (as peers told by a
    /// rendezvous server are) reach each other through the NAT with no forward and the
    /// default mapping and filtering: each one's first packet to the other's endpoint
    /// makes its translation, the second one's is the answer to the first, and from then
    /// on both ways are answers. Their MACs come from those packets.
    #[test]
    fn inside_peers_reach_each_other_by_their_external_endpoints() {
        let udp = |src_port, dst_port| L4::Udp { src_port, dst_port };
        let mut n = nat("");
        let (a, b) = ("198.18.0.1", "198.18.0.2");
        let (a_mac, b_mac) = ([2, 0, 0, 0, 0, 0x0a], [2, 0, 0, 0, 0, 0x0b]);
        let from = |mac: [u8; 6], mut f: Vec<u8>| {
            f[6..12].copy_from_slice(&mac);
            f
        };
        // A's packet to B's endpoint (external:6000) finds nothing yet.
        let first = from(a_mac, frame(a, EXTERNAL, udp(5000, 6000)));
        assert_eq!(one(&mut n, S, first, 0).0, Verdict::Drop(NO_TRANSLATION));
        // B's to A's (external:5000) answers it.
        let (v, k, bytes) = one(
            &mut n,
            S,
            from(b_mac, frame(b, EXTERNAL, udp(6000, 5000))),
            0,
        );
        assert_eq!(v, IN);
        assert_eq!((addr(&k, true), k.src_port), (ip(EXTERNAL), 6000));
        assert_eq!((addr(&k, false), k.dst_port), (ip(a), 5000));
        assert_eq!(&bytes[..6], &a_mac[..]);
        let (v, k, bytes) = one(
            &mut n,
            S,
            from(a_mac, frame(a, EXTERNAL, udp(5000, 6000))),
            0,
        );
        assert_eq!(v, IN);
        assert_eq!((addr(&k, false), k.dst_port), (ip(b), 6000));
        assert_eq!(&bytes[..6], &b_mac[..]);
        assert!(ipv4_checksums_valid(&bytes));
    }

    /// Thousands of inside hosts to one server through a pool of 1,024 ports: every port
    /// is given once, the rest are refused as `ports_exhausted`, and neither an allocation
    /// nor a refusal looks at more than a few ports on average (before, each refusal drew
    /// 64); a port freed by a reset goes to the next connection.
    #[test]
    fn a_crowded_destination_allocates_and_refuses_in_constant_time() {
        let mut n = nat("ports = \"20000-21023\"\ncapacity = 8192");
        let syn = |i: u32| {
            let host = format!("198.18.{}.{}", i / 250, 1 + i % 250);
            frame(&host, REMOTE, tcp(40_000, 80, flags::SYN))
        };
        let mut ports = std::collections::BTreeSet::new();
        let mut refused = 0;
        for i in 0..5_000u32 {
            match one(&mut n, S, syn(i), 0) {
                (OUT, key, _) => assert!(ports.insert(key.src_port), "port {} twice", key.src_port),
                (v, _, _) => {
                    assert_eq!(v, Verdict::Drop(PORTS_EXHAUSTED));
                    refused += 1;
                }
            }
        }
        assert_eq!((ports.len(), refused), (1024, 3_976));
        assert!(
            n.port_probes < 5 * 5_000,
            "{} ports looked at for 5,000 connections",
            n.port_probes
        );
        // One connection reset: its port is the next one's.
        let (_, key, _) = one(&mut n, S, syn(0), 0);
        let rst = frame(REMOTE, EXTERNAL, tcp(80, key.src_port, flags::RST));
        assert_eq!(one(&mut n, S, rst, 1).0, IN);
        let (v, again, _) = one(&mut n, S, syn(9_999), 0);
        assert_eq!((v, again.src_port), (OUT, key.src_port));
        assert_eq!(
            one(&mut n, S, syn(10_000), 0).0,
            Verdict::Drop(PORTS_EXHAUSTED)
        );
    }

    /// Under port parity every external port has its inside port's parity, drawn,
    /// listed (a crowded destination) and refused alike: odd connections use up the odd
    /// ports and are refused while every even port is still there for even ones.
    #[test]
    fn port_parity_keeps_each_connections_parity_down_to_the_last_port() {
        let mut n = nat("ports = \"20000-21023\"\ncapacity = 8192\nport_parity = true");
        let syn = |i: u32, port: u16| {
            let host = format!("198.18.{}.{}", i / 250, 1 + i % 250);
            frame(&host, REMOTE, tcp(port, 80, flags::SYN))
        };
        let mut ports = std::collections::BTreeSet::new();
        let mut refused = 0;
        for i in 0..700u32 {
            match one(&mut n, S, syn(i, 40_001), 0) {
                (OUT, key, _) => {
                    assert_eq!(key.src_port % 2, 1, "connection {i}");
                    assert!(ports.insert(key.src_port), "port {} twice", key.src_port);
                }
                (v, _, _) => {
                    assert_eq!(v, Verdict::Drop(PORTS_EXHAUSTED));
                    refused += 1;
                }
            }
        }
        assert_eq!(
            (ports.len(), refused),
            (512, 188),
            "every odd port, then none"
        );
        for i in 700..1_212u32 {
            let (v, key, _) = one(&mut n, S, syn(i, 40_000), 0);
            assert_eq!((v, key.src_port % 2), (OUT, 0), "connection {i}");
            assert!(ports.insert(key.src_port));
        }
        assert_eq!(
            one(&mut n, S, syn(1_212, 40_000), 0).0,
            Verdict::Drop(PORTS_EXHAUSTED)
        );
        // Its own port, when free and in the pool, has its parity already.
        let mut own = nat("port_parity = true");
        let (v, key, _) = one(&mut own, S, syn(0, 40_003), 0);
        assert_eq!((v, key.src_port), (OUT, 40_003));
    }

    /// The ports in use are counted by parity once a reload turns port parity on (the
    /// old counts, by destination alone, are not taken).
    #[test]
    fn a_reload_that_turns_port_parity_on_counts_the_ports_by_parity() {
        let config = "ports = \"20000-21023\"";
        let mut old = nat(config);
        for i in 0..300u16 {
            let syn = frame(INSIDE, REMOTE, tcp(40_000 + i, 80, flags::SYN));
            assert_eq!(one(&mut old, S, syn, 0).0, OUT);
        }
        let mut new = nat(&format!("{config}\nport_parity = true"));
        let carried = Program::inherit(&mut new, old, S);
        assert_eq!(carried[0].kept, 300);
        let dests = &new.answers.dests;
        assert_eq!(
            dests.len(),
            2,
            "the destination's even ports and its odd ones"
        );
        assert_eq!(dests.values().map(|d| d.in_use).sum::<u32>(), 300);
    }

    #[test]
    fn translations_time_out_by_state_and_a_reset_removes_one_at_once() {
        // A small table, so that the sweeps of a few bursts see all of it.
        let mut n = nat("capacity = 8\n[timeouts]\ntcp_transitory = 10.0\nudp = 30.0");
        let syn = frame(INSIDE, REMOTE, tcp(40_000, 80, flags::SYN));
        let udp = frame(
            INSIDE,
            REMOTE,
            L4::Udp {
                src_port: 40_000,
                dst_port: 53,
            },
        );
        run(&mut n, S, &[(syn, 0), (udp.clone(), 0)]);
        assert_eq!(n.len(), 2);
        // UDP is refreshed by its traffic; the unanswered TCP connection is not.
        for t in [8, 16, 24] {
            run(&mut n, t * S, &[(udp.clone(), 0)]);
        }
        assert_eq!(n.len(), 1, "the SYN with no answer aged out after 10 s");
        assert_eq!(n.expired[NatState::TcpNew as usize], 1);
        // Its answer entry went with it: the late SYN+ACK (to the port it kept) finds nothing.
        let late = frame(REMOTE, EXTERNAL, tcp(80, 40_000, flags::SYN | flags::ACK));
        assert_eq!(
            one(&mut n, 25 * S, late, 1).0,
            Verdict::Drop(NO_TRANSLATION)
        );
        // A new connection, answered, then reset from the outside: gone at once.
        run(
            &mut n,
            26 * S,
            &[(frame(INSIDE, REMOTE, tcp(40_001, 80, flags::SYN)), 0)],
        );
        let rst = frame(REMOTE, EXTERNAL, tcp(80, 40_001, flags::RST));
        assert_eq!(
            one(&mut n, 26 * S, rst.clone(), 1).0,
            IN,
            "the reset itself passes"
        );
        assert_eq!(one(&mut n, 26 * S, rst, 1).0, Verdict::Drop(NO_TRANSLATION));
        assert_eq!(n.len(), 1);
        assert_eq!(n.answers.len(), 1, "every answer entry has its translation");
    }

    /// A half-closed connection (the inside sent its FIN, the outside streams on) stays
    /// as long as packets keep coming within the transitory timeout (RFC 5382: an idle
    /// timeout of 4 minutes), and ages out 4 minutes after the last.
    #[test]
    fn a_half_closed_connection_lives_while_its_packets_flow() {
        let mut n = nat("capacity = 8");
        let out = |f| frame(INSIDE, REMOTE, tcp(40_000, 80, f));
        let answer = || frame(REMOTE, EXTERNAL, tcp(80, 40_000, flags::ACK));
        run(&mut n, S, &[(out(flags::SYN), 0)]);
        let syn_ack = frame(REMOTE, EXTERNAL, tcp(80, 40_000, flags::SYN | flags::ACK));
        assert_eq!(one(&mut n, S, syn_ack, 1).0, IN);
        run(&mut n, S, &[(out(flags::FIN | flags::ACK), 0)]);
        for i in 1..=5 {
            let t = S + i * 200 * S;
            assert_eq!(
                one(&mut n, t, answer(), 1).0,
                IN,
                "{} s after the FIN",
                i * 200
            );
        }
        let key = inside_key(TCP, 40_000, 80);
        assert_eq!(n.translation_of(&key).unwrap().state, NatState::TcpClosing);
        let late = S + 1000 * S + 241 * S;
        assert_eq!(
            one(&mut n, late, answer(), 1).0,
            Verdict::Drop(NO_TRANSLATION)
        );
        assert_eq!(n.expired[NatState::TcpClosing as usize], 1);
    }

    #[test]
    fn with_several_workers_answers_hash_back_to_the_worker_that_translated() {
        let workers = 4;
        let h = hasher();
        for worker in 0..workers {
            let mut n = nat("");
            for port in 0..50u16 {
                let f = frame(INSIDE, REMOTE, tcp(3000 + port, 443, flags::SYN));
                let (v, bytes) = run_as(&mut n, S, &[(f, 0)], worker, workers).remove(0);
                assert_eq!(v, OUT);
                // The answer as the runtime will see it, and the worker it will go to.
                let out = parse(&bytes, 0, &h).unwrap().key;
                assert_eq!(addr(&out, false), ip(REMOTE));
                let answer = frame(
                    REMOTE,
                    EXTERNAL,
                    tcp(443, out.src_port, flags::SYN | flags::ACK),
                );
                let parsed = parse(&answer, 1, &h).unwrap();
                assert_eq!(shard_of(parsed.hash, workers), worker);
                let (v, _) = run_as(&mut n, S, &[(answer, 1)], worker, workers).remove(0);
                assert_eq!(v, IN);
            }
        }
    }

    /// On live ports with several workers, which spread packets by the remote address, any
    /// port's answers come back: each connection keeps its own port, as with one worker,
    /// rather than one of the ports the runtime's hash would send back.
    #[test]
    fn on_live_ports_a_worker_takes_any_port() {
        let mut n = nat("");
        let live = || Context {
            worker: 1,
            workers: 2,
            by_hash: false,
            ..ctx(S, 3)
        };
        for port in 3000..3050u16 {
            let f = frame(INSIDE, REMOTE, tcp(port, 443, flags::SYN));
            let (v, bytes) = crate::testutil::run_in(&mut n, &[(f, 0)], live()).remove(0);
            let out = parse(&bytes, 0, &hasher()).unwrap().key;
            assert_eq!((v, out.src_port), (OUT, port));
        }
    }

    #[test]
    fn a_translation_deleted_by_the_control_plane_frees_its_port() {
        let mut n = nat("ports = \"40000-40000\"");
        let syn = frame(INSIDE, REMOTE, tcp(40_000, 80, flags::SYN));
        assert_eq!(one(&mut n, S, syn, 0).0, OUT);
        let other = frame("198.18.0.7", REMOTE, tcp(40_000, 80, flags::SYN));
        assert_eq!(
            one(&mut n, S, other.clone(), 0).0,
            Verdict::Drop(PORTS_EXHAUSTED)
        );
        let key = inside_key(TCP, 40_000, 80);
        let delete = Request::Write {
            table: "translations".into(),
            writes: vec![Write::Delete(key.fields())],
        };
        n.control(&delete, None, &ctx(S, 3)).unwrap();
        assert_eq!((n.len(), n.answers.len()), (0, 0));
        assert_eq!(one(&mut n, S, other, 0).0, OUT, "the port is free again");
        // Inserting is the data plane's alone (the control server checks every request
        // against the declaration before a program sees it).
        let insert = Request::Write {
            table: "translations".into(),
            writes: vec![Write::Insert(stateplane_state::control::Entry {
                key: key.fields(),
                action: "udp".into(),
                params: vec![1, 0, 0],
                priority: 0,
                hits: 0,
            })],
        };
        assert!(n.declarations()[0].check(&insert).is_err());
        assert!(n.declarations()[0].check(&delete).is_ok());
    }

    proptest::proptest! {
        /// Random connections from many inside hosts (clashing ports included): each goes
        /// out with valid checksums as the external address, and its answer comes back to
        /// exactly the inside host and port that opened it.
        #[test]
        fn every_answer_is_restored_to_its_connection(
            conns in proptest::collection::vec(
                (1u8..8, 1u16..4, 1u8..4, 0u8..3, proptest::prelude::any::<bool>()),
                1..60,
            )
        ) {
            let mut n = nat("ports = \"1024-1100\"");
            for (i, &(host, port, remote, proto, answer_twice)) in conns.iter().enumerate() {
                let inside = format!("198.18.0.{host}");
                let remote = format!("198.19.0.{remote}");
                let sport = 1023 + port; // 1024..1026: often the same port from two hosts
                let l4 = |out: bool, nat_port: u16| match proto {
                    0 => tcp(if out { sport } else { 80 }, if out { 80 } else { nat_port }, flags::ACK),
                    1 => L4::Udp {
                        src_port: if out { sport } else { 53 },
                        dst_port: if out { 53 } else { nat_port },
                    },
                    _ => L4::IcmpEcho { request: out, ident: if out { sport } else { nat_port }, seq: 1 },
                };
                let t = S + i as u64;
                let (v, out, bytes) = one(&mut n, t, frame(&inside, &remote, l4(true, 0)), 0);
                proptest::prop_assert_eq!(v, OUT);
                proptest::prop_assert!(ipv4_checksums_valid(&bytes));
                proptest::prop_assert_eq!(addr(&out, true), ip(EXTERNAL));
                let nat_port = out.src_port; // ICMP: the identifier, where the key keeps it
                for _ in 0..1 + u8::from(answer_twice) {
                    let answer = frame(&remote, EXTERNAL, l4(false, nat_port));
                    let (v, back, bytes) = one(&mut n, t, answer, 1);
                    proptest::prop_assert_eq!(v, IN);
                    proptest::prop_assert!(ipv4_checksums_valid(&bytes));
                    proptest::prop_assert_eq!(addr(&back, false), ip(&inside));
                    let restored = if proto == 2 { back.src_port } else { back.dst_port };
                    proptest::prop_assert_eq!(restored, sport);
                }
            }
            proptest::prop_assert_eq!(n.answers.len(), n.len());
        }
    }

    #[test]
    fn a_forwarded_port_lets_an_outside_client_reach_an_inside_server() {
        let mut n = nat(
            "ports = \"20000-65535\"\nforwards = [\n  { proto = \"tcp\", port = 8080, to = \"198.18.0.5\", to_port = 80 },\n  { proto = \"udp\", port = 53, to = \"198.18.0.6\" },\n]",
        );
        // The outside client's SYN to the external address, port 8080, reaches the server.
        let syn = frame(REMOTE, EXTERNAL, tcp(50_000, 8080, flags::SYN));
        let (v, key, bytes) = one(&mut n, S, syn, 1);
        assert_eq!(v, IN);
        assert_eq!((addr(&key, false), key.dst_port), (ip("198.18.0.5"), 80));
        assert_eq!(
            (addr(&key, true), key.src_port),
            (ip(REMOTE), 50_000),
            "from the client"
        );
        assert!(ipv4_checksums_valid(&bytes));
        // The server's answer leaves from the forwarded port.
        let syn_ack = frame(
            "198.18.0.5",
            REMOTE,
            tcp(80, 50_000, flags::SYN | flags::ACK),
        );
        let (v, key, bytes) = one(&mut n, S + 1, syn_ack, 0);
        assert_eq!(v, OUT);
        assert_eq!((addr(&key, true), key.src_port), (ip(EXTERNAL), 8080));
        assert!(ipv4_checksums_valid(&bytes));
        let ack = frame(REMOTE, EXTERNAL, tcp(50_000, 8080, flags::ACK));
        assert_eq!(one(&mut n, S + 2, ack, 1).0, IN);
        let inside = FlowKey::v4(
            "198.18.0.5".parse().unwrap(),
            REMOTE.parse().unwrap(),
            TCP,
            80,
            50_000,
        );
        assert_eq!(
            n.translation_of(&inside).map(|t| t.state),
            Some(NatState::TcpEstablished)
        );
        // Only a SYN opens a forwarded TCP connection; other ports stay closed.
        let stray = frame(REMOTE, EXTERNAL, tcp(50_001, 8080, flags::ACK));
        assert_eq!(one(&mut n, S, stray, 1).0, Verdict::Drop(NO_TRANSLATION));
        let closed = frame(REMOTE, EXTERNAL, tcp(50_002, 8081, flags::SYN));
        assert_eq!(one(&mut n, S, closed, 1).0, Verdict::Drop(NO_TRANSLATION));
        // UDP to a forwarded port, to the same port inside.
        let query = frame(
            REMOTE,
            EXTERNAL,
            L4::Udp {
                src_port: 4000,
                dst_port: 53,
            },
        );
        let (v, key, _) = one(&mut n, S, query, 1);
        assert_eq!(v, IN);
        assert_eq!((addr(&key, false), key.dst_port), (ip("198.18.0.6"), 53));
    }

    /// A forwarded connection whose translation has expired, not yet swept: the same
    /// client's next SYN to the forwarded port opens it again (before, the stale answer
    /// entry dropped it until the sweep came by).
    #[test]
    fn an_expired_forwarded_connection_opens_again_before_the_sweep() {
        let mut n = nat(
            "ports = \"20000-65535\"\nforwards = [{ proto = \"udp\", port = 53, to = \"198.18.0.6\" }]",
        );
        let query = frame(
            REMOTE,
            EXTERNAL,
            L4::Udp {
                src_port: 4000,
                dst_port: 53,
            },
        );
        assert_eq!(one(&mut n, S, query.clone(), 1).0, IN);
        // Past the UDP timeout (30 s), in a single packet's burst: the sweep has seen at
        // most a few slots.
        assert_eq!(one(&mut n, 400 * S, query, 1).0, IN);
        assert_eq!(n.expired[NatState::Udp as usize], 1);
        assert_eq!(n.len(), 1);
    }

    /// A SYN flood from the inside at 10x the table: established translations keep theirs
    /// and their answers come back; the flood's SYNs still go out, each taking the room of
    /// an unanswered one (whose port returns to the pool). Without early drop, the full
    /// table refuses the flood and anything new.
    #[test]
    fn a_flood_displaces_only_unanswered_translations() {
        for early in [true, false] {
            let mut n = nat(&format!("capacity = 64\nearly_drop = {early}"));
            let host = |i: u32| format!("198.18.{}.{}", i / 200, 1 + i % 200);
            for i in 0..32u32 {
                let syn = frame(&host(i), REMOTE, tcp(40_000, 80, flags::SYN));
                let (_, key, _) = one(&mut n, S, syn, 0);
                let syn_ack = frame(
                    REMOTE,
                    EXTERNAL,
                    tcp(80, key.src_port, flags::SYN | flags::ACK),
                );
                assert_eq!(one(&mut n, S, syn_ack, 1).0, IN);
            }
            let out = (0..640u32)
                .filter(|&i| {
                    let syn = frame(
                        &host(1_000 + i),
                        "198.19.9.9",
                        tcp(1024 + i as u16, 80, flags::SYN),
                    );
                    one(&mut n, 2 * S, syn, 0).0 == OUT
                })
                .count();
            assert!(n.len() <= 64);
            if early {
                assert!(out > 600, "{out} of 640 flood SYNs went out");
            } else {
                assert_eq!(out, 32, "only until the table was full");
            }
            for i in 0..32u32 {
                let key = FlowKey::v4(
                    host(i).parse().unwrap(),
                    REMOTE.parse().unwrap(),
                    TCP,
                    40_000,
                    80,
                );
                let t = n
                    .translation_of(&key)
                    .expect("an established translation stays");
                let data = frame(REMOTE, EXTERNAL, tcp(80, t.external_port, flags::ACK));
                assert_eq!(one(&mut n, 3 * S, data, 1).0, IN, "early drop {early}");
            }
        }
    }

    #[test]
    fn forwards_are_checked() {
        let names = PortNames(vec!["inside".into(), "outside".into()]);
        let err = |extra: &str| {
            let cfg: NatConfig =
                toml::from_str(&format!("external = \"{EXTERNAL}\"\n{extra}")).unwrap();
            Nat::new(&cfg, &names, "program.nat", 1)
                .err()
                .map(|e| e.field)
        };
        let fwd = |body: &str| format!("forwards = [{{ {body} }}]");
        assert_eq!(
            err(&fwd("proto = \"tcp\", port = 8080, to = \"198.18.0.5\"")).as_deref(),
            Some("program.nat.forwards[0].port"),
            "8080 is in the default pool"
        );
        assert_eq!(
            err(&fwd("proto = \"sctp\", port = 80, to = \"198.18.0.5\"")).as_deref(),
            Some("program.nat.forwards[0].proto")
        );
        assert_eq!(
            err(&fwd("proto = \"tcp\", port = 80, to = \"nowhere\"")).as_deref(),
            Some("program.nat.forwards[0].to")
        );
        let twice = "forwards = [\n{ proto = \"tcp\", port = 80, to = \"198.18.0.5\" },\n{ proto = \"tcp\", port = 80, to = \"198.18.0.6\" }]";
        assert_eq!(err(twice).as_deref(), Some("program.nat.forwards[1].port"));
    }

    #[test]
    fn clustered_inside_ports_do_not_exhaust_a_pool_that_has_room() {
        // 3,000 hosts open connections to one server from ports 40000 up, which they keep;
        // 3,000 more use the same ports, so each must find another port away from that
        // run of taken ones. A walk from the inside port would run out of tries in it.
        let mut n = nat("capacity = 8192");
        let mut frames = Vec::new();
        for round in 0..2u32 {
            for i in 0..3000u32 {
                let h = round * 3000 + i;
                let src = format!("198.18.{}.{}", 1 + h / 250, 1 + h % 250);
                frames.push((
                    frame(&src, REMOTE, tcp(40_000 + i as u16, 80, flags::SYN)),
                    0,
                ));
            }
        }
        let mut ports = std::collections::HashSet::new();
        for chunk in frames.chunks(256) {
            for (v, bytes) in run(&mut n, S, chunk) {
                assert_eq!(v, OUT);
                ports.insert(parse(&bytes, 0, &hasher()).unwrap().key.src_port);
            }
        }
        assert_eq!(
            ports.len(),
            6000,
            "one external port per connection to the server"
        );
    }

    #[test]
    fn configuration_errors_name_the_field() {
        let names = PortNames(vec!["inside".into(), "outside".into()]);
        for (text, field) in [
            ("external = \"host\"", "program.nat.external"),
            (
                "external = \"198.18.0.9\"\nports = \"10-5\"",
                "program.nat.ports",
            ),
            (
                "external = \"198.18.0.9\"\nports = \"0-5\"",
                "program.nat.ports",
            ),
            (
                "external = \"198.18.0.9\"\ncapacity = 0",
                "program.nat.capacity",
            ),
            (
                "external = \"198.18.0.9\"\noutside = \"inside\"\ninside = \"inside\"",
                "program.nat.outside",
            ),
            (
                "external = \"198.18.0.9\"\ninside = \"eth9\"",
                "program.nat.inside",
            ),
            (
                "external = \"198.18.0.9\"\n[timeouts]\nudp = 0.0",
                "program.nat.timeouts.udp",
            ),
            (
                "external = \"198.18.0.9\"\nipv6 = \"maybe\"",
                "program.nat.ipv6",
            ),
            (
                "external = \"198.18.0.9\"\nmapping = \"independent\"",
                "program.nat.mapping",
            ),
            (
                "external = \"198.18.0.9\"\nmapping = \"endpoint_independent\"\n\
                 filtering = \"open\"",
                "program.nat.filtering",
            ),
            // Letting in to a port that several endpoints may share names no one endpoint.
            (
                "external = \"198.18.0.9\"\nfiltering = \"endpoint_independent\"",
                "program.nat.filtering",
            ),
            // Blocks: of 1 port up to the pool's, none of 1 port under parity (it would
            // have ports of one parity only), and a bound only where there are blocks.
            (
                "external = \"198.18.0.9\"\nport_block = 0",
                "program.nat.port_block",
            ),
            (
                "external = \"198.18.0.9\"\nports = \"2000-2099\"\nport_block = 101",
                "program.nat.port_block",
            ),
            (
                "external = \"198.18.0.9\"\nport_block = 1\nport_parity = true",
                "program.nat.port_block",
            ),
            (
                "external = \"198.18.0.9\"\nport_block = 64\nblocks_per_host = 0",
                "program.nat.blocks_per_host",
            ),
            (
                "external = \"198.18.0.9\"\nblocks_per_host = 4",
                "program.nat.blocks_per_host",
            ),
        ] {
            let cfg: NatConfig = toml::from_str(text).unwrap();
            let err = Nat::new(&cfg, &names, "program.nat", 1).err().unwrap();
            assert_eq!(err.field, field, "{text}: {err}");
        }
    }
}
