//! The network functions that ship with Stateplane.
//!
//! Owns: each program's logic and its configuration, and [`build`], which turns a program
//! name and its TOML table into a factory of per-worker instances.
//!
//! Must never: touch ports, threads or files (the runtime and the CLI do), or keep per-flow
//! state shared between workers (each instance owns its worker's shard of flows; `steer`
//! shares only its paths' liveness).

pub mod acl;
pub mod chain;
pub mod conntrack;
#[cfg(test)]
mod control_tests;
pub mod counter;
pub mod firewall;
pub mod flood;
pub mod flowlet;
pub mod forward;
pub mod hh;
mod keys;
pub mod kv;
pub mod l2;
pub mod l2learn;
pub mod lb;
pub mod monitor;
pub mod nat;
pub mod pipeline;
mod replicated_tables;
mod report;
pub mod router;
pub mod sgw;
mod sketches;
pub mod steer;
pub mod superspreader;
mod synced_parts;
mod synced_tables;
#[cfg(test)]
mod testutil;

use stateplane_runtime::{Burst, Context, PortId, Prepared, Program, ProgramFactory, Running};
use stateplane_state::{
    ControlError, Declaration, ExpireMode, ExpireProfile, Guarantee, Notification, Reply, Request,
};
use stateplane_wire::{FlowHasher, FlowKey};
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, PoisonError, RwLock};

/// Writes `Program::inherit` for a program whose state is one `DeclaredTable` at field
/// `$table` that packets fill (learned, counted), nothing beside it derived from it: a
/// reload keeps its entries (`DeclaredTable::adopt`). Not for a table the configuration
/// fills: the old configuration's entries would come back.
macro_rules! inherit_table {
    ($table:ident) => {
        fn inherit(&mut self, mut old: Self, _now_ns: u64) -> Vec<stateplane_state::Carried> {
            vec![self.$table.adopt(&mut old.$table)]
        }
    };
}
pub(crate) use inherit_table;

/// Writes `Program::inherit` for a program whose declared state the configuration makes
/// (routes, static entries, rules): the new instance's is the new configuration's, and a
/// reload says so for each declaration.
macro_rules! configured_state {
    () => {
        fn inherit(&mut self, _old: Self, _now_ns: u64) -> Vec<stateplane_state::Carried> {
            (self.declarations().iter())
                .map(|d| stateplane_state::Carried::configured(&d.name))
                .collect()
        }
    };
}
pub(crate) use configured_state;

/// Writes the `Program` methods of a program whose control-plane state is one
/// `DeclaredTable`, at field path `$table` (`cache`, or `reports.table`): its declaration,
/// the answers to requests about it, and its notifications. Used inside
/// `impl Program for ...`.
#[macro_export]
macro_rules! answer_by_table {
    ($($table:ident).+) => {
        fn declarations(&self) -> Vec<$crate::macro_support::Declaration> {
            vec![self.$($table).+.declaration().clone()]
        }

        fn control(
            &mut self,
            request: &$crate::macro_support::Request,
            _prepared: Option<&std::sync::Arc<Self::Prepared>>,
            ctx: &$crate::macro_support::Context,
        ) -> Result<$crate::macro_support::Reply, $crate::macro_support::ControlError> {
            self.$($table).+.answer(request, ctx.now_ns)
        }

        fn notifications(&mut self, out: &mut Vec<$crate::macro_support::Notification>) {
            self.$($table).+.take_notifications(out);
        }
    };
}

#[doc(hidden)]
pub mod macro_support {
    pub use stateplane_runtime::Context;
    pub use stateplane_state::{ControlError, Declaration, Notification, Reply, Request};
}

/// Table slots an expiry sweep looks at per `poll` (about once a millisecond on idle live
/// ports): a million-slot table is swept in about four seconds with no traffic at all.
pub(crate) const IDLE_SWEEP: usize = 256;

/// Table slots an expiry sweep looks at for a burst of `packets`: two per packet, plus a
/// few per burst so that a quiet link still ages entries out. The whole table is seen
/// every `slots / 2` packets, well inside the shortest timeout at any rate that fills it.
pub(crate) fn sweep_budget(packets: usize) -> usize {
    16 + 2 * packets
}

/// The programs `build` knows, with a line about each.
pub const CATALOG: &[(&str, &str)] = &[
    (
        "acl",
        "5-tuple permit/deny list (first match wins) before forward or router",
    ),
    (
        "chain",
        "programs one after another (stages = [\"acl\", \"nat\", \"router\"])",
    ),
    (
        "conntrack",
        "TCP/UDP connection tracking by add-on-miss, with per-state idle timeouts",
    ),
    (
        "counter",
        "packet and byte counters per flow, updated by every packet",
    ),
    (
        "firewall",
        "stateful firewall: the inside opens connections as an acl policy allows, the outside only answers",
    ),
    (
        "synflood",
        "TCP SYN flood detection per destination, with dropping or rate-limiting",
    ),
    (
        "udpflood",
        "UDP flood detection per destination, with dropping or rate-limiting",
    ),
    (
        "flowlet",
        "flowlet switching: a flow moves between equal-cost next hops only after a pause",
    ),
    ("forward", "port-to-port pass-through by a static port map"),
    (
        "hh",
        "heavy hitters: flows over a threshold per interval, by a count-min sketch per VLAN",
    ),
    (
        "kv",
        "in-network key-value cache: GETs of cached keys answered by the data plane",
    ),
    ("l2", "Ethernet switching by a static MAC table"),
    (
        "l2learn",
        "Ethernet learning switch: learns by add-on-miss, floods the unknown, ages out",
    ),
    (
        "lb",
        "layer-4 load balancer: VIPs to backend pools by Maglev hashing, per-connection affinity",
    ),
    (
        "nat",
        "source NAT (NAPT) for TCP, UDP and ICMP echo, translations added on the first packet",
    ),
    (
        "pipeline",
        "OpenFlow-style tables of wildcard rules, with a microflow cache that is never stale",
    ),
    (
        "router",
        "IPv4/IPv6 forwarding by longest-prefix match, TTL and MAC rewriting",
    ),
    (
        "sgw",
        "mobile serving gateway: GTP-U tunnels per subscriber, sessions made by GTPv2-C signaling",
    ),
    (
        "steer",
        "spreads flows over parallel switches and moves them off one that stops answering",
    ),
    (
        "superspreader",
        "sources contacting more than k distinct destinations per interval",
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

/// A prefix as configurations write it: `198.18.0.0/16`, `2001:2::/48`, or a bare address
/// (a host prefix). Host bits beyond the length are left to the tables, which ignore them.
pub(crate) fn parse_prefix(field: &str, text: &str) -> Result<(IpAddr, u8), ConfigError> {
    let bad = || {
        ConfigError::new(
            field,
            format!("'{text}' is not a prefix like 198.19.0.0/16 or 2001:2::/48, or an address"),
        )
    };
    let (addr, len) = match text.split_once('/') {
        Some((a, l)) => (a, Some(l.parse::<u8>().map_err(|_| bad())?)),
        None => (text, None),
    };
    let addr: IpAddr = addr.parse().map_err(|_| bad())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(max);
    if len > max {
        return Err(bad());
    }
    Ok((addr, len))
}

/// Checks a per-worker table size in the configuration: 1 to 2^26 `what`.
pub(crate) fn check_capacity(field: &str, capacity: usize, what: &str) -> Result<(), ConfigError> {
    if capacity == 0 || capacity > 1 << 26 {
        return Err(ConfigError::new(
            field,
            format!("give 1 to 67108864 {what} per worker"),
        ));
    }
    Ok(())
}

/// Expiry profiles that delete entries idle for so many seconds, from `(name, seconds)`
/// pairs in order (the fields `{field}.{name}`); each must be 0.001 to 10^7 seconds.
pub(crate) fn idle_profiles(
    field: &str,
    timeouts: &[(&str, f64)],
) -> Result<Vec<ExpireProfile>, ConfigError> {
    timeouts
        .iter()
        .map(|&(name, secs)| {
            if !(0.001..=1e7).contains(&secs) {
                return Err(ConfigError::new(
                    format!("{field}.{name}"),
                    format!("{secs} is outside 0.001 to 10000000 seconds"),
                ));
            }
            Ok(ExpireProfile {
                timeout_ns: (secs * 1e9) as u64,
                mode: ExpireMode::AutoDelete,
            })
        })
        .collect()
}

/// An IPv4 address as configurations write it, as its four bytes.
pub(crate) fn parse_ipv4(field: &str, text: &str) -> Result<[u8; 4], ConfigError> {
    text.parse::<std::net::Ipv4Addr>()
        .map(|a| a.octets())
        .map_err(|_| {
            ConfigError::new(
                field,
                format!("'{text}' is not an IPv4 address like 198.19.0.1"),
            )
        })
}

/// A program's settings that do not parse, with where they go when one is missing (a run
/// with no configuration gives the program none).
fn settings_error(field: &str, e: &toml::de::Error) -> ConfigError {
    let mut problem = e.message().to_owned();
    if problem.starts_with("missing field") {
        problem.push_str(&format!(
            "; give the program's settings in a `[{field}]` table of a configuration \
             (`stateplane run --config FILE`; docs/programs.md and docs/cli.md list them)"
        ));
    }
    ConfigError::new(field, problem)
}

/// Parses the program's table as `C`, builds the program once with `make` (so configuration
/// errors surface here, not in a worker), and gives each worker its own clone: an empty copy
/// of per-worker tables, or a handle on shared read-only ones (`Arc`s inside the program).
/// Programs of your own build their factory with it too (see [`register`]).
pub fn factory<C, P>(
    table: toml::Value,
    field: &str,
    make: impl FnOnce(&C) -> Result<P, ConfigError>,
) -> Result<ProgramFactory, ConfigError>
where
    C: serde::de::DeserializeOwned,
    P: Program + Clone + Sync + 'static,
{
    let cfg: C = table.try_into().map_err(|e| settings_error(field, &e))?;
    let program = make(&cfg)?;
    Ok(Arc::new(move |_| Box::new(program.clone())))
}

/// An exact table of `capacity` entries, its bytes in every copy of the program claimed
/// from the run's memory budget first: refused, the error names `field` (the setting that
/// sizes it) with the total and the fix, and nothing is allocated.
pub(crate) fn budgeted_table<K, V>(
    field: &str,
    capacity: usize,
    profiles: &[stateplane_state::ExpireProfile],
    seed: u64,
) -> Result<stateplane_state::ExactTable<K, V>, ConfigError>
where
    K: stateplane_state::TableKey,
    V: Copy + Default + bytemuck::Zeroable,
{
    claim_bytes(
        field,
        || format!("{capacity} entries"),
        stateplane_state::ExactTable::<K, V>::bytes_for(capacity),
    )?;
    Ok(stateplane_state::ExactTable::new(capacity, profiles, seed))
}

/// Claims `bytes` that every copy of the program keeps from the run's memory budget (see
/// [`budgeted_table`]).
pub(crate) fn claim_bytes(
    field: &str,
    what: impl FnOnce() -> String,
    bytes: u64,
) -> Result<(), ConfigError> {
    stateplane_mem::budget::claim(field, what, bytes)
        .map_err(|e| ConfigError::new(field, e.to_string()))
}

/// For settings that are on unless turned off.
pub(crate) fn default_true() -> bool {
    true
}

/// A random seed for a program's tables, drawn once per process, so crafted traffic
/// cannot aim at a bucket; the same for every build, so that a reload's tables hash as
/// the old ones did and take their entries whole (`ExactTable::adopt`).
pub(crate) fn table_seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| FlowHasher::random().hash(&FlowKey::EMPTY))
}

/// How a program from outside this crate is built: from its settings (an empty table if
/// the configuration has none), the switch's ports, and the configuration field its
/// settings are under (`program.NAME`, for errors).
pub type Builder = fn(toml::Value, &PortNames, &str) -> Result<ProgramFactory, ConfigError>;

/// Programs registered from outside this crate: name, a line about it, its builder.
static REGISTERED: RwLock<Vec<(&'static str, &'static str, Builder)>> = RwLock::new(Vec::new());

/// Adds a program of your own to those [`build`] knows (and so to `stateplane run`, the
/// lab's switches and the control API when your binary hands over to `stateplane::main`).
/// Refused if the name is taken.
pub fn register(
    name: &'static str,
    about: &'static str,
    builder: Builder,
) -> Result<(), ConfigError> {
    let mut registered = REGISTERED.write().unwrap_or_else(PoisonError::into_inner);
    if CATALOG.iter().any(|(n, _)| *n == name) || registered.iter().any(|r| r.0 == name) {
        return Err(ConfigError::new(
            "program",
            format!("'{name}' is already a program; give yours another name"),
        ));
    }
    registered.push((name, about, builder));
    Ok(())
}

/// Every program `build` knows, built-in and registered, with a line about each, by name
/// (as help and errors list them).
pub fn catalog() -> Vec<(&'static str, &'static str)> {
    let registered = REGISTERED.read().unwrap_or_else(PoisonError::into_inner);
    let mut all: Vec<_> = CATALOG.to_vec();
    all.extend(registered.iter().map(|r| (r.0, r.1)));
    all.sort_unstable_by_key(|(name, _)| *name);
    all
}

/// Builds the factory of program `name` from its configuration table (`None`: defaults).
pub fn build(
    name: &str,
    config: Option<&toml::Value>,
    ports: &PortNames,
) -> Result<ProgramFactory, ConfigError> {
    let field = format!("program.{name}");
    let f = field.as_str();
    let table = config
        .cloned()
        .unwrap_or_else(|| toml::Value::Table(Default::default()));
    match name {
        "forward" => factory(table, f, |c| forward::Forward::new(c, ports, f)),
        "l2" => factory(table, f, |c| l2::L2::new(c, ports, f, table_seed())),
        "l2learn" => factory(table, f, |c| {
            l2learn::L2Learn::new(c, ports, f, table_seed())
        }),
        "acl" => factory(table, f, |c| acl::Acl::new(c, ports, f)),
        "chain" => {
            let cfg: chain::ChainConfig = table.try_into().map_err(|e| settings_error(f, &e))?;
            chain::factory(&cfg, ports, f)
        }
        "conntrack" => factory(table, f, |c| {
            conntrack::Conntrack::new(c, ports, f, table_seed())
        }),
        "lb" => factory(table, f, |c| lb::Lb::new(c, ports, f, table_seed())),
        "counter" => factory(table, f, |c| {
            counter::Counter::new(c, ports, f, table_seed())
        }),
        "hh" => factory(table, f, |c| hh::Hh::new(c, ports, f, table_seed())),
        "udpflood" => factory(table, f, |c| {
            flood::Flood::new(flood::Attack::Udp, c, ports, f, table_seed())
        }),
        "synflood" => factory(table, f, |c| {
            flood::Flood::new(flood::Attack::Syn, c, ports, f, table_seed())
        }),
        "flowlet" => factory(table, f, |c| {
            flowlet::Flowlet::new(c, ports, f, table_seed())
        }),
        "kv" => factory(table, f, |c| kv::Kv::new(c, ports, f, table_seed())),
        "nat" => factory(table, f, |c| nat::Nat::new(c, ports, f, table_seed())),
        "firewall" => factory(table, f, |c| {
            firewall::Firewall::new(c, ports, f, table_seed())
        }),
        "router" => factory(table, f, |c| router::Router::new(c, ports, f)),
        "pipeline" => factory(table, f, |c| pipeline::Pipeline::new(c, ports, f)),
        "sgw" => factory(table, f, |c| sgw::Sgw::new(c, ports, f, table_seed())),
        "steer" => factory(table, f, |c| steer::Steer::new(c, ports, f)),
        "superspreader" => factory(table, f, |c| {
            superspreader::Superspreader::new(c, ports, f, table_seed())
        }),
        other => {
            let registered = REGISTERED.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(r) = registered.iter().find(|r| r.0 == other) {
                return (r.2)(table, ports, f);
            }
            drop(registered);
            let names: Vec<&str> = catalog().iter().map(|(n, _)| *n).collect();
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

/// Gives declared state the guarantees a configuration asks for (`[guarantees]` in the run
/// configuration, e.g. `connections = ["replicated"]`): a program's code declares its
/// state, the operator chooses what it promises, and the stages that keep the promises read
/// them from the declarations, so no program changes for them. Each name must be declared
/// by the program and each guarantee known.
pub fn with_guarantees(
    factory: ProgramFactory,
    wanted: &BTreeMap<String, Vec<String>>,
    mode: ReplicationMode,
) -> Result<ProgramFactory, ConfigError> {
    if wanted.is_empty() {
        return Ok(factory);
    }
    let declared = factory(0).declarations();
    let mut overrides = Vec::new();
    for (name, guarantees) in wanted {
        let field = format!("guarantees.{name}");
        if !declared.iter().any(|d| &d.name == name) {
            let names: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
            return Err(ConfigError::new(
                field,
                format!(
                    "the program declares no `{name}`; it declares: {}",
                    if names.is_empty() {
                        "nothing".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
            ));
        }
        let known = || Guarantee::ALL.map(Guarantee::name).join(", ");
        let parsed = guarantees
            .iter()
            .map(|g| {
                Guarantee::ALL
                    .into_iter()
                    .find(|x| x.name() == g)
                    .ok_or_else(|| {
                        ConfigError::new(&field, format!("'{g}' is not one of {}", known()))
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if parsed.is_empty() {
            return Err(ConfigError::new(
                field,
                format!("give one or more of {}", known()),
            ));
        }
        if let Some(&g) = parsed.iter().find(|&&g| {
            !matches!(
                g,
                Guarantee::Local | Guarantee::Synced | Guarantee::Replicated
            )
        }) {
            return Err(ConfigError::new(field, not_built(g)));
        }
        if parsed.contains(&Guarantee::Replicated) && mode == ReplicationMode::Bounded {
            let mut probe = factory(0);
            if probe.track_snapshots(name, 0).is_none() || !probe.snapshot_begin(0) {
                return Err(ConfigError::new(
                    field,
                    format!(
                        "`{name}` cannot be replicated in bounded mode: its snapshots are \
                         not built (bounded state today is a program's count-min sketch, \
                         `sketch` in hh, udpflood and synflood); replicate it with \
                         replication.mode = \"linearizable\" if the program offers that"
                    ),
                ));
            }
            if parsed.contains(&Guarantee::Synced) {
                return Err(ConfigError::new(
                    field,
                    format!(
                        "`{name}` cannot be both synced and replicated in bounded mode (the \
                         snapshots read the marks the sync stage would take): sync it, or \
                         replicate it, not both; other state of the program may be synced \
                         beside it"
                    ),
                ));
            }
        } else if parsed.contains(&Guarantee::Replicated) && !factory(0).replicate(name) {
            // A sketch is replicated as periodic snapshots, which the user may not know.
            let bounded = factory(0).track_snapshots(name, 0).is_some();
            let fix = if bounded {
                format!(
                    "`{name}` is replicated in bounded mode, as periodic snapshots: set \
                     replication.mode = \"bounded\" (docs/REPLICATION.md, Bounded mode)"
                )
            } else {
                "docs/REPLICATION.md says what is built and what follows".to_string()
            };
            return Err(ConfigError::new(
                field,
                format!(
                    "`{name}` cannot be replicated linearizably yet: replicated state today is counter's \
                     `flows`, conntrack's and firewall's `connections`, lb's `connections`, \
                     kv's `cache`, nat's `translations` (without port forwards or port \
                     blocks, under the default filtering) and sgw's `sessions`; {fix}"
                ),
            ));
        }
        if parsed.contains(&Guarantee::Synced) {
            let mut probe = factory(0);
            if probe.track(name, 0).is_none() {
                return Err(ConfigError::new(
                    field,
                    format!(
                        "`{name}` cannot be synced: the program does not track its changes (synced \
                     state today is what the data plane writes: a program's count-min sketch, \
                     `sketch` in hh, udpflood, synflood and superspreader, with what it \
                     found, `heavy_hitters`, `victims` and `spreaders`; the rule counters \
                     `rule_packets` and `rule_bytes` in acl and firewall; and the tables \
                     `flows` in counter, `connections` in conntrack, firewall and lb, `cache` \
                     in kv, `macs` in l2, `stations` in l2learn, `translations` in nat and \
                     `sessions` in sgw, and in a chain what its stages sync; not the rules, \
                     routes and meters the control plane writes; a table's slot takes at \
                     most 64 words, 16 key fields and 16 parameters)"
                    ),
                ));
            }
            // Every copy a worker runs keeps the room of the state it tracks.
            claim_bytes(
                &field,
                || format!("the staging of writes into `{name}`, synced"),
                probe.synced_room_bytes(),
            )?;
        }
        if parsed.contains(&Guarantee::Synced) && parsed.contains(&Guarantee::Replicated) {
            log::info!(
                "`{name}` is both synced and replicated: the collector reads it, but its \
                 writes into it are refused (its entries change through the store alone; \
                 docs/SYNC.md)"
            );
        }
        overrides.push((name.clone(), parsed));
    }
    let overrides = Arc::new(overrides);
    Ok(Arc::new(move |w| {
        Guaranteed::boxed(factory(w), overrides.clone(), mode)
    }))
}

/// How replicated state is kept (`replication.mode`): a program's state is replicated per
/// flow, each change acknowledged before its packet leaves, or as periodic snapshots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReplicationMode {
    #[default]
    Linearizable,
    Bounded,
}

/// Why `g` is refused: no stage keeps it yet, and a promise nothing keeps must not be
/// accepted.
fn not_built(g: Guarantee) -> String {
    let missing = match g {
        Guarantee::Local | Guarantee::Synced | Guarantee::Replicated => "",
        Guarantee::Exported => {
            "no stage exports a program's declared tables yet (flow records come from the \
             run's [flows] section)"
        }
    };
    format!(
        "'{}' is not built yet: {missing}; only 'local', 'synced' and 'replicated' are kept today, and a guarantee that \
         nothing keeps is refused rather than ignored",
        g.name()
    )
}

/// A program whose declarations carry the configured guarantees, and whose state
/// replicated in snapshots and `synced` state are tracked, in that order, ids 0, 1, ...,
/// each kind in the configuration's order of names; everything else is the program's own.
struct Guaranteed {
    inner: Box<dyn Running>,
    overrides: Arc<Vec<(String, Vec<Guarantee>)>>,
    /// The ids below this are the snapshots' state, those from it the synced state.
    first_synced: u16,
    /// The bits of each synced state that is a register (by id), whose top-down writes
    /// are checked against them.
    register_bits: Vec<Option<u8>>,
    /// Values of the write in progress refused as wider than their register's cells.
    values_refused: u64,
    /// The words of an entry of each synced state (by id): a table's slot's, else 1.
    strides: Vec<u32>,
}

impl Guaranteed {
    fn boxed(
        mut inner: Box<dyn Running>,
        overrides: Arc<Vec<(String, Vec<Guarantee>)>>,
        mode: ReplicationMode,
    ) -> Box<dyn Running> {
        // `with_guarantees` made sure an instance can replicate each name; the replication
        // stage checks the declarations against `replicated_key` before it starts.
        let replicated = |g: &Vec<Guarantee>| g.contains(&Guarantee::Replicated);
        if mode == ReplicationMode::Linearizable {
            for (name, _) in overrides.iter().filter(|(_, g)| replicated(g)) {
                let _ = inner.replicate(name);
            }
        }
        // Tracked, ids 0, 1, ...: the state replicated in snapshots, then the synced state
        // (`with_guarantees` refuses a name that is both), each in the names' order
        // (`overrides` is in the order of the configuration's map). The snapshots' ids
        // stay as they are when state is synced beside them, and the switch's sync plan
        // names the synced ones so (`SyncPlan::naming`).
        let snapshotted: Vec<&String> = (overrides.iter())
            .filter(|(_, g)| mode == ReplicationMode::Bounded && replicated(g))
            .map(|(name, _)| name)
            .collect();
        let synced = (overrides.iter())
            .filter(|(_, g)| g.contains(&Guarantee::Synced))
            .map(|(name, _)| name);
        let first_synced = snapshotted.len() as u16;
        let declared = inner.declarations();
        let mut register_bits = Vec::new();
        let mut strides = Vec::new();
        for (id, name) in snapshotted.iter().copied().chain(synced).enumerate() {
            // `with_guarantees` made sure an instance tracks each name; one that did not
            // would sync nothing, so the sync stage checks `synced()` against the
            // declarations before it starts.
            let _ = match (id as u16) < first_synced {
                true => inner.track_snapshots(name, id as u16),
                false => inner.track(name, id as u16),
            };
            let d = declared.iter().find(|d| &d.name == name);
            register_bits.push(d.and_then(|d| match d.kind {
                stateplane_state::Kind::Register { bits } => Some(bits),
                _ => None,
            }));
            strides.push(
                d.and_then(|d| stateplane_state::synced_table::SlotWords::of(d, &[]))
                    .map_or(1, |w| w.stride() as u32),
            );
        }
        Box::new(Guaranteed {
            inner,
            overrides,
            first_synced,
            register_bits,
            values_refused: 0,
            strides,
        })
    }

    /// The state the inner program tracks that is synced (`synced`: the ids from
    /// `first_synced` on), or else replicated in snapshots (the ids below).
    fn tracked(&self, synced: bool) -> Vec<(u16, u32)> {
        let mut tracked = self.inner.synced();
        tracked.retain(|&(id, _)| (id >= self.first_synced) == synced);
        tracked
    }
}

impl Program for Guaranteed {
    /// What the program inside prepared.
    type Prepared = Prepared;

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        self.inner.process(burst, ctx);
    }

    fn poll(&mut self, out: &mut Burst, ctx: &mut Context) {
        self.inner.poll(out, ctx);
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        self.inner.drop_reasons()
    }

    fn check_workers(&self, workers: usize, live: bool) -> Result<(), String> {
        self.inner.check_workers(workers, live)
    }

    fn steering(&self, port: PortId) -> stateplane_runtime::Steering {
        self.inner.steering(port)
    }

    fn requests(&mut self, out: &mut Vec<Request>) {
        self.inner.requests(out);
    }

    fn declarations(&self) -> Vec<Declaration> {
        let mut declared = self.inner.declarations();
        for d in &mut declared {
            if let Some((_, g)) = self.overrides.iter().find(|(name, _)| *name == d.name) {
                d.guarantees = g.clone();
            }
        }
        declared
    }

    fn prepare(&self, request: &Request) -> Result<Option<Arc<Prepared>>, ControlError> {
        Ok(self.inner.prepare(request)?.map(Arc::new))
    }

    fn control(
        &mut self,
        request: &Request,
        prepared: Option<&Arc<Prepared>>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        self.inner
            .control(request, prepared.map(|p| p.as_ref()), ctx)
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) {
        self.inner.notifications(out);
    }

    fn track(&mut self, name: &str, id: u16) -> Option<u32> {
        self.inner.track(name, id)
    }

    fn synced_room_bytes(&self) -> u64 {
        self.inner.synced_room_bytes()
    }

    fn make_synced_resident(&mut self) {
        self.inner.make_synced_resident();
    }

    fn changes(&mut self, out: &mut Vec<stateplane_state::changes::Change>, budget: usize) -> bool {
        self.inner.changes(out, budget)
    }

    /// The synced state alone.
    fn synced(&self) -> Vec<(u16, u32)> {
        self.tracked(true)
    }

    fn track_snapshots(&mut self, name: &str, id: u16) -> Option<u32> {
        self.inner.track_snapshots(name, id)
    }

    /// The state replicated in snapshots alone.
    fn snapshotted(&self) -> Vec<(u16, u32)> {
        self.tracked(false)
    }

    fn synced_stride(&self, id: u16) -> u32 {
        self.strides.get(usize::from(id)).copied().unwrap_or(1)
    }

    fn read_synced(&self, id: u16, index: u32) -> Option<u64> {
        self.inner.read_synced(id, index)
    }

    fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize {
        self.inner.read_synced_run(id, first, out)
    }

    /// A value wider than its register's cells is refused (nothing written) and counted
    /// with the write's refusals, rather than cut: the collector's user asked for a value
    /// the switch cannot hold.
    fn write_synced(&mut self, id: u16, index: u32, value: u64) -> Option<u64> {
        let bits = self.register_bits.get(usize::from(id)).copied().flatten();
        if bits.is_some_and(|bits| bits < 64 && value >> bits != 0) {
            self.values_refused += 1;
            return None;
        }
        self.inner.write_synced(id, index, value)
    }

    fn snapshot_begin(&mut self, id: u16) -> bool {
        self.inner.snapshot_begin(id)
    }

    fn snapshot_read(&mut self, id: u16, first: u32, out: &mut [u64]) -> usize {
        self.inner.snapshot_read(id, first, out)
    }

    fn snapshot_changed(&self, id: u16, first: u32, len: u32) -> bool {
        self.inner.snapshot_changed(id, first, len)
    }

    fn snapshot_aside(&self) -> Vec<u64> {
        self.inner.snapshot_aside()
    }

    fn install_aside(&mut self, words: &[u64]) {
        self.inner.install_aside(words);
    }

    fn write_synced_run(&mut self, id: u16, first: u32, values: &[u64]) {
        if self
            .register_bits
            .get(usize::from(id))
            .copied()
            .flatten()
            .is_some()
        {
            // Each value is checked against the register's cells.
            for (index, &value) in (first..).zip(values) {
                let _ = Program::write_synced(self, id, index, value);
            }
        } else {
            self.inner.write_synced_run(id, first, values);
        }
    }

    /// A register's values are checked as the commit writes them: only a table stages.
    fn stage_synced_run(&mut self, id: u16, first: u32, values: &[u64]) -> bool {
        let register = (self.register_bits.get(usize::from(id))).is_some_and(Option::is_some);
        !register && self.inner.stage_synced_run(id, first, values)
    }

    fn drop_synced_write(&mut self) {
        self.inner.drop_synced_write();
    }

    fn commit_synced_write(&mut self) -> u64 {
        self.inner.commit_synced_write() + std::mem::take(&mut self.values_refused)
    }

    fn replicate(&mut self, name: &str) -> bool {
        self.inner.replicate(name)
    }

    fn replicated_key(
        &self,
        packet: &stateplane_runtime::PacketDesc,
        data: &[u8],
    ) -> Option<stateplane_runtime::FlowBytes> {
        self.inner.replicated_key(packet, data)
    }

    fn replicated_alias(
        &self,
        packet: &stateplane_runtime::PacketDesc,
        data: &[u8],
    ) -> Option<stateplane_runtime::FlowBytes> {
        self.inner.replicated_alias(packet, data)
    }

    fn replicated_alias_of(
        &self,
        key: &stateplane_runtime::FlowBytes,
    ) -> Option<stateplane_runtime::FlowBytes> {
        self.inner.replicated_alias_of(key)
    }

    fn replicated_state(&self, key: &stateplane_runtime::FlowBytes) -> Option<Vec<u8>> {
        self.inner.replicated_state(key)
    }

    fn replicated_state_into(
        &self,
        key: &stateplane_runtime::FlowBytes,
        out: &mut Vec<u8>,
        hint: &mut u32,
    ) -> Option<u64> {
        self.inner.replicated_state_into(key, out, hint)
    }

    fn install_replicated(
        &mut self,
        key: &stateplane_runtime::FlowBytes,
        state: Option<&[u8]>,
        now_ns: u64,
    ) -> bool {
        self.inner.install_replicated(key, state, now_ns)
    }

    fn check_leases(&mut self) -> bool {
        self.inner.check_leases()
    }

    fn mark_leased(&mut self, key: &stateplane_runtime::FlowBytes, until_ns: Option<u64>) {
        self.inner.mark_leased(key, until_ns);
    }

    fn set_lease_clock(&mut self, now_ns: u64) {
        self.inner.set_lease_clock(now_ns);
    }

    fn clear_leases(&mut self) {
        self.inner.clear_leases();
    }

    fn take_leased_changes(
        &mut self,
        every: bool,
        out: &mut Vec<stateplane_runtime::LeasedPacket>,
    ) -> u64 {
        self.inner.take_leased_changes(every, out)
    }

    fn inherit(&mut self, old: Self, now_ns: u64) -> Vec<stateplane_state::Carried> {
        self.inner.inherit(old.inner, now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hh's sketch replicated in snapshots beside its heavy hitters synced: the snapshots'
    /// state takes the first id and is never among the sync stage's changes (the
    /// snapshots read its marks), the synced table's changes are; one name cannot be both.
    #[test]
    fn a_sketch_in_snapshots_and_synced_reports_are_tracked_apart() {
        use stateplane_state::{Reply, Request};
        let names = PortNames(vec!["a".into(), "b".into()]);
        let wanted = |pairs: &[(&str, &[&str])]| -> BTreeMap<String, Vec<String>> {
            (pairs.iter())
                .map(|(n, g)| (n.to_string(), g.iter().map(|g| g.to_string()).collect()))
                .collect()
        };
        let both = wanted(&[("sketch", &["replicated"]), ("heavy_hitters", &["synced"])]);
        let cfg = toml::Value::Table(toml::from_str("tenants = 1\nwidth = 64\ndepth = 2").unwrap());
        let factory = build("hh", Some(&cfg), &names).unwrap();
        let factory = with_guarantees(factory, &both, ReplicationMode::Bounded).unwrap();
        let mut p = factory(0);
        let cells = 2 * 2 * 64;
        assert_eq!(p.snapshotted(), [(0, cells)]);
        let synced = p.synced();
        assert_eq!(synced.len(), 1);
        assert_eq!(synced[0].0, 1, "after the snapshots' state");
        // A change of the sketch (the control API's write) and one of the table (a synced
        // write of one report, whole).
        let request = Request::WriteRegister {
            name: "sketch".into(),
            first: 3,
            count: 1,
            value: 9,
        };
        let ctx = crate::testutil::ctx(1, 2);
        assert!(matches!(p.control(&request, None, &ctx), Ok(Reply::Done)));
        let declared = p.declarations();
        let reports = declared.iter().find(|d| d.name == "heavy_hitters").unwrap();
        let stride = stateplane_state::synced_table::SlotWords::of(reports, &[])
            .unwrap()
            .stride() as u32;
        for w in 0..stride {
            // Action 1 (`found`), a key of 7s, interval 1, estimate 7.
            let value = if w == 0 { 1 } else { 7 };
            assert_eq!(p.write_synced(1, w, value), Some(0));
        }
        assert_eq!(p.commit_synced_write(), 0);
        let mut changes = Vec::new();
        assert!(p.changes(&mut changes, usize::MAX));
        assert!(
            !changes.is_empty() && changes.iter().all(|c| c.state == 1),
            "{changes:?}"
        );
        // The snapshot has the sketch's write.
        assert!(p.snapshot_begin(0));
        let mut words = vec![0; cells as usize];
        assert_eq!(p.snapshot_read(0, 0, &mut words), cells as usize);
        assert_eq!(words[3], 9);

        let same = wanted(&[("sketch", &["replicated", "synced"])]);
        let factory = build("hh", None, &names).unwrap();
        let Err(e) = with_guarantees(factory, &same, ReplicationMode::Bounded) else {
            panic!("one name both synced and in snapshots")
        };
        assert!(
            e.problem
                .contains("cannot be both synced and replicated in bounded mode"),
            "{e}"
        );
    }

    /// An unknown name is refused with every program, in the order of their names (as
    /// `run --help` lists them): a reader finds one in a sorted list.
    #[test]
    fn an_unknown_program_is_refused_with_the_catalog_by_name() {
        let names: Vec<&str> = catalog().iter().map(|(n, _)| *n).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
        assert!(names.len() >= 20, "{names:?}");
        let Err(e) = build("nosuch", None, &PortNames(Vec::new())) else {
            panic!("an unknown program was built")
        };
        assert!(
            e.to_string()
                .contains(&format!("choose one of: {}", sorted.join(", "))),
            "{e}"
        );
    }
}
