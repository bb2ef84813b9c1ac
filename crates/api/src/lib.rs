//! The control API's types: what a program's state looks like to the control plane, and
//! what the control plane may ask of it. Shared by the runtime (which carries requests to
//! the workers), the state primitives (which answer them) and the gRPC layer.
//!
//! Owns: how a table or register is described to clients (its [`Declaration`]: name,
//! capacity, guarantees, key fields with their widths and match kinds, actions with their
//! parameters), the field-level form of entries every table kind shares ([`Entry`],
//! [`Match`]), the requests a program answers between bursts ([`Request`]) and its replies
//! ([`Reply`]), the checks a request must pass against a declaration before any worker sees
//! it ([`Declaration::check`]), the errors split by cause ([`ControlError`]), the
//! notifications the data plane sends ([`Notification`]), and the changes synced state
//! hands the sync stage ([`Change`]), and what a reload did with each piece of
//! state ([`Carried`]).
//!
//! Must never: touch state (the state crate applies requests, next to its tables), do I/O,
//! or know the wire format of the control API (the gRPC layer converts).
//!
//! Field values travel as `u128` (an IPv6 address is the widest field); a value must fit
//! the field's declared width. Ports are port indices.

mod reload;

pub use reload::{Carried, Fate};
use std::fmt;

/// One change of one cell of synced state, as the sync stage takes it: the cell's value
/// at the stage's last take, and now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// The state's id among the worker's synced state.
    pub state: u16,
    pub index: u32,
    pub old: u64,
    pub new: u64,
    /// The value must reach the collector as it is, at every change, whatever the
    /// threshold: a table's key or action, where a value near the right one is a wrong one.
    pub exact: bool,
    /// A top-down write placed it (a table's entry, wherever its key hashes): the value
    /// goes to the collector as the write's, at once and costing the rate controller one
    /// update, so that a write of large values does not raise the threshold the rest of
    /// the copy is bounded by.
    pub by_write: bool,
}

impl Change {
    /// What the change costs the channel's budget, as the rate controller counts it: its
    /// divergence, or one update for a change that is always sent.
    #[inline]
    pub fn cost(&self) -> u64 {
        if self.exact || self.by_write {
            u64::from(self.old != self.new)
        } else {
            self.new.abs_diff(self.old)
        }
    }
}

/// What a piece of state promises beyond this worker's memory. Declared with the state, so
/// that the sync, replication and flow-record stages can honour it without the program's
/// logic changing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarantee {
    /// Kept by this worker only (the default).
    Local,
    /// Copies on other switches converge (approximately, within a bound).
    Synced,
    /// Survives the switch's failure (written through to a store before output).
    Replicated,
    /// Reported to collectors (flow records).
    Exported,
}

impl Guarantee {
    pub const ALL: [Guarantee; 4] = [
        Guarantee::Local,
        Guarantee::Synced,
        Guarantee::Replicated,
        Guarantee::Exported,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Guarantee::Local => "local",
            Guarantee::Synced => "synced",
            Guarantee::Replicated => "replicated",
            Guarantee::Exported => "exported",
        }
    }
}

/// How a field's value is written for people (the client parses and prints by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Int,
    Mac,
    Ipv4,
    Ipv6,
    /// Either family in 128 bits: IPv4 as the IPv4-mapped IPv6 address `::ffff:a.b.c.d`.
    Ip,
}

/// An IP address as a [`Format::Ip`] field value.
pub fn ip_value(addr: std::net::IpAddr) -> u128 {
    match addr {
        std::net::IpAddr::V4(a) => u128::from(a.to_ipv6_mapped()),
        std::net::IpAddr::V6(a) => u128::from(a),
    }
}

/// A [`Format::Ip`] field value as an address.
pub fn ip_addr(value: u128) -> std::net::IpAddr {
    let v6 = std::net::Ipv6Addr::from(value);
    match v6.to_ipv4_mapped() {
        Some(v4) => std::net::IpAddr::V4(v4),
        None => std::net::IpAddr::V6(v6),
    }
}

/// How a key field is matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchKind {
    Exact,
    Lpm,
    Ternary,
    Range,
}

/// A key field or an action parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub bits: u8,
    pub format: Format,
    pub kind: MatchKind,
    /// For a field that names one of the switch's ports: how many it has (the values are 0
    /// to `ports - 1`), so that an entry sending packets nowhere is refused.
    pub ports: Option<u16>,
}

impl Field {
    pub fn new(name: &str, bits: u8, format: Format, kind: MatchKind) -> Field {
        Field {
            name: name.to_string(),
            bits,
            format,
            kind,
            ports: None,
        }
    }

    pub fn exact(name: &str, bits: u8, format: Format) -> Field {
        Field::new(name, bits, format, MatchKind::Exact)
    }

    /// An exact 16-bit field naming one of a switch's `ports` ports.
    pub fn port(name: &str, ports: usize) -> Field {
        Field {
            ports: Some(u16::try_from(ports).unwrap_or(u16::MAX)),
            ..Field::exact(name, 16, Format::Int)
        }
    }

    /// Whether `value` fits the field's width.
    pub fn check_value(&self, value: u128) -> Result<(), ControlError> {
        if value > largest(self.bits) {
            return Err(ControlError::Width {
                field: self.name.clone(),
                bits: self.bits,
            });
        }
        if let Some(ports) = self.ports
            && value >= u128::from(ports)
        {
            return Err(ControlError::NoSuchPort {
                field: self.name.clone(),
                port: value,
                ports,
            });
        }
        Ok(())
    }
}

/// The largest value `bits` bits hold.
fn largest(bits: u8) -> u128 {
    if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    }
}

/// An action a table's entries can carry, with its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    pub name: String,
    pub params: Vec<Field>,
}

/// What kind of state is declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A match table: key fields, the actions its entries carry, and whether the control
    /// plane may write it (tables the data plane alone fills are read and deleted only).
    Table {
        key: Vec<Field>,
        actions: Vec<Action>,
        writable: bool,
    },
    /// An array of `bits`-wide values, readable and writable by index.
    Register { bits: u8 },
    /// An array of meters (srTCM or trTCM, or off), configured by index.
    Meters,
    /// OpenFlow-style tables 0 to `tables - 1` of prioritized wildcard rules, written and
    /// read as rule text (see [`FlowChange`]).
    Rules { tables: u8 },
}

/// Which rules a flow request is about: those of `table` (all tables if `None`) whose
/// cookie agrees with `cookie` on the bits of `cookie_mask` (as `ovs-ofctl`'s
/// `cookie=VALUE/MASK`; a zero mask takes every cookie).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowFilter {
    pub table: Option<u8>,
    pub cookie: u64,
    pub cookie_mask: u64,
}

impl FlowFilter {
    pub fn matches(&self, table: u8, cookie: u64) -> bool {
        self.table.is_none_or(|t| t == table) && (cookie ^ self.cookie) & self.cookie_mask == 0
    }
}

/// A change to, or a read of, a rule pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlowChange {
    /// Adds these rules (one per line, the rule text format), all or none. A rule with the
    /// table, priority and match of one there replaces it (OpenFlow's add), its counters
    /// starting from zero, or from the replaced rule's with `keep_counters`.
    Add {
        lines: Vec<String>,
        keep_counters: bool,
    },
    /// Gives the matching rules these actions (the text after `actions=`), keeping their
    /// counters.
    Modify {
        filter: FlowFilter,
        actions: String,
    },
    Delete(FlowFilter),
    Dump(FlowFilter),
    /// Makes the rules of `table` (or of every table) these (one per line, the rule text
    /// format), at once and all or none, changing only what differs: a rule identical in
    /// everything stays with its counters and timers; the others there are deleted and
    /// the new ones added.
    Replace {
        table: Option<u8>,
        lines: Vec<String>,
    },
    /// Removes rules whose timeout ran out. The data plane asks for it (a worker that
    /// finds a rule idle on every worker, or past its hard timeout), never a client: the
    /// control API does not carry it.
    Expire(Vec<Expiry>),
}

/// A rule a worker found expired, and which of its timeouts ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    pub id: u64,
    /// The rule's insert sequence number: the expiry is for that rule only, not for a
    /// later one given the same id.
    pub seq: u64,
    pub reason: RemovedReason,
}

/// Why a rule left its pipeline (OpenFlow's flow-removed reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovedReason {
    /// No packet matched it for its idle timeout, on any worker.
    IdleTimeout,
    /// Its hard timeout ran out.
    HardTimeout,
    /// A client deleted it.
    Delete,
}

impl RemovedReason {
    /// The name `ovs-ofctl monitor` prints.
    pub fn name(self) -> &'static str {
        match self {
            RemovedReason::IdleTimeout => "idle",
            RemovedReason::HardTimeout => "hard",
            RemovedReason::Delete => "delete",
        }
    }
}

/// A rule as a dump shows it, with its counters summed over workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowStat {
    /// The rule's handle: the same on every worker; a removed rule's is given to a later
    /// rule.
    pub id: u64,
    pub table: u8,
    pub priority: u16,
    pub cookie: u64,
    /// The rule in the text format `Add` takes.
    pub rule: String,
    pub packets: u64,
    pub bytes: u64,
    /// How long the rule has been in the pipeline (the longest a worker has held it).
    pub duration_ns: u64,
    /// How long since a packet matched it on any worker (or since it was added).
    pub idle_ns: u64,
    /// The data plane's time when it was read (the latest worker's).
    pub at_ns: u64,
}

impl FlowStat {
    /// Adds another worker's view of the same rule: counters summed, the longest
    /// duration, the shortest idle time, the latest time.
    pub fn merge(&mut self, other: &FlowStat) {
        self.packets += other.packets;
        self.bytes += other.bytes;
        self.duration_ns = self.duration_ns.max(other.duration_ns);
        self.idle_ns = self.idle_ns.min(other.idle_ns);
        self.at_ns = self.at_ns.max(other.at_ns);
    }
}

/// A table's or register's declaration: its name in the control API, its size, what it
/// promises, and its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    pub name: String,
    pub capacity: usize,
    pub guarantees: Vec<Guarantee>,
    pub kind: Kind,
}

/// One key field's match in an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Match {
    Exact(u128),
    Prefix { value: u128, len: u8 },
    Ternary { value: u128, mask: u128 },
    Range { low: u128, high: u128 },
}

/// A table entry as the control plane sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: Vec<Match>,
    pub action: String,
    pub params: Vec<u128>,
    /// Ternary and range tables: higher wins. Zero elsewhere.
    pub priority: u32,
    /// Lookups that hit the entry (reads only; ignored on writes).
    pub hits: u64,
}

/// One change to a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Insert(Entry),
    Modify(Entry),
    Delete(Vec<Match>),
}

/// What the control plane asks of a program, answered between two bursts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Applies every write, in order, or none of them.
    Write { table: String, writes: Vec<Write> },
    /// The entry with this key, or a page of entries: those from position `from` (0 at
    /// first, then the `next` of the page before) up to [`READ_PAGE`] positions on.
    Read {
        table: String,
        key: Option<Vec<Match>>,
        from: usize,
    },
    /// `count` values from `first`.
    ReadRegister {
        name: String,
        first: usize,
        count: usize,
    },
    /// Sets `count` values from `first` to `value`.
    WriteRegister {
        name: String,
        first: usize,
        count: usize,
        value: u128,
    },
    /// The table's counters.
    Stats { table: String },
    /// Sets `count` meters from `first` to `config` (their buckets start full).
    SetMeter {
        name: String,
        first: usize,
        count: usize,
        config: MeterConfig,
    },
    /// The settings of `count` meters from `first`.
    ReadMeter {
        name: String,
        first: usize,
        count: usize,
    },
    /// A change to a rule pipeline, or a dump of its rules.
    Flows { name: String, change: FlowChange },
    /// Where each key of `table` is counted: the counters of the program's sketch
    /// register whose least is the key's estimate, on each worker. `table` is the table
    /// the program reports the sketch's keys in (its key fields are the keys' fields); a
    /// collector's copy of the synced register then estimates any key's count.
    CountersOf {
        table: String,
        keys: Vec<Vec<Match>>,
    },
}

impl Request {
    /// The table or register the request is about.
    pub fn target(&self) -> &str {
        match self {
            Request::Write { table, .. }
            | Request::Read { table, .. }
            | Request::CountersOf { table, .. }
            | Request::Stats { table } => table,
            Request::ReadRegister { name, .. }
            | Request::WriteRegister { name, .. }
            | Request::SetMeter { name, .. }
            | Request::ReadMeter { name, .. }
            | Request::Flows { name, .. } => name,
        }
    }
}

/// A program's answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Reply {
    #[default]
    Done,
    Entries(Vec<Entry>),
    /// What a replace did: the rules it deleted (with their counters), and how many it
    /// added and kept.
    Replaced {
        removed: Vec<FlowStat>,
        added: u64,
        kept: u64,
    },
    /// A page of a read, and where the next page starts (`None`: this was the last).
    Page(Vec<Entry>, Option<usize>),
    Values(Vec<u128>),
    Counters(Vec<(&'static str, u64)>),
    Meters(Vec<MeterConfig>),
    /// The rules a flow request dumped, modified or deleted.
    Flows(Vec<FlowStat>),
    /// Each worker's answer to [`Request::CountersOf`], in worker order.
    CountersOf(Vec<WorkerCounters>),
}

/// Where one worker counts the keys of a [`Request::CountersOf`]: for each key, in the
/// request's order, the indexes of its counters in the sketch register. A key the worker
/// has counted nowhere yet (a tenant without a sketch of its own so far) has none: its
/// count there is 0, and the next packet of it may give it counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCounters {
    pub worker: u32,
    pub cells: Vec<Vec<u32>>,
}

/// Why a request was refused. Every refusal leaves the state as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlError {
    UnknownTable {
        name: String,
        known: Vec<String>,
    },
    UnknownAction {
        table: String,
        action: String,
        known: Vec<String>,
    },
    /// A key has the wrong number of fields or an action the wrong number of parameters.
    Arity {
        what: String,
        expected: usize,
        got: usize,
    },
    /// A value does not fit its field.
    Width {
        field: String,
        bits: u8,
    },
    /// A field was given a match of another kind (e.g. a prefix for an exact field).
    MatchKind {
        field: String,
        expected: MatchKind,
    },
    ReadOnly {
        table: String,
    },
    TableFull {
        table: String,
        capacity: usize,
    },
    /// A write that would take the run past its memory budget (`why` says by how much
    /// and the fix).
    OverBudget {
        table: String,
        why: String,
    },
    Exists {
        table: String,
    },
    NoSuchEntry {
        table: String,
    },
    OutOfRange {
        name: String,
        index: usize,
        size: usize,
    },
    /// A field naming a switch port names one the switch does not have.
    NoSuchPort {
        field: String,
        port: u128,
        ports: u16,
    },
    /// Settings that cannot work (e.g. a meter's peak rate below its committed rate).
    Invalid {
        what: String,
        why: String,
    },
    /// The program was replaced or stopped while the request waited.
    Unavailable,
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::UnknownTable { name, known } => {
                write!(
                    f,
                    "no table or register `{name}`; the program has: {}",
                    list(known)
                )
            }
            ControlError::UnknownAction {
                table,
                action,
                known,
            } => write!(
                f,
                "table `{table}` has no action `{action}`; its actions are: {}",
                list(known)
            ),
            ControlError::Arity {
                what,
                expected,
                got,
            } => {
                write!(f, "{what} takes {expected} values, not {got}")
            }
            ControlError::Width { field, bits } => {
                write!(
                    f,
                    "the value of `{field}` does not fit its {bits} bits (0 to {})",
                    largest(*bits)
                )
            }
            ControlError::NoSuchPort { field, port, ports } => match ports {
                0 => write!(f, "`{field}`: there is no port {port}; the switch has none"),
                _ => write!(
                    f,
                    "`{field}`: there is no port {port}; the switch has ports 0 to {}",
                    ports - 1
                ),
            },
            ControlError::MatchKind { field, expected } => {
                write!(
                    f,
                    "`{field}` is matched {expected:?}, give it that kind of match"
                )
            }
            ControlError::ReadOnly { table } => write!(
                f,
                "table `{table}` is filled by the data plane: it can be read and its entries deleted"
            ),
            ControlError::TableFull { table, capacity } => {
                write!(
                    f,
                    "table `{table}` is full ({capacity} entries); nothing was written"
                )
            }
            ControlError::OverBudget { table, why } => {
                write!(f, "table `{table}`: {why}; nothing was written")
            }
            ControlError::Exists { table } => write!(
                f,
                "table `{table}` already has an entry with that key (modify it instead); nothing was written"
            ),
            ControlError::NoSuchEntry { table } => {
                write!(
                    f,
                    "table `{table}` has no entry with that key; nothing was written"
                )
            }
            ControlError::OutOfRange { name, index, size } => {
                write!(
                    f,
                    "index {index} is out of range for `{name}` (size {size})"
                )
            }
            ControlError::Invalid { what, why } => write!(f, "{what}: {why}"),
            ControlError::Unavailable => {
                write!(f, "the program was replaced or stopped; try again")
            }
        }
    }
}

impl std::error::Error for ControlError {}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// Finds the declaration a request is about, or says which ones there are.
pub fn find<'a>(decls: &'a [Declaration], name: &str) -> Result<&'a Declaration, ControlError> {
    decls
        .iter()
        .find(|d| d.name == name)
        .ok_or_else(|| ControlError::UnknownTable {
            name: name.to_string(),
            known: decls.iter().map(|d| d.name.clone()).collect(),
        })
}

impl Declaration {
    /// Checks everything about `req` that does not depend on the table's contents, so a
    /// request that passes can fail only on a full table or a missing or existing key, the
    /// same on every worker.
    pub fn check(&self, req: &Request) -> Result<(), ControlError> {
        match (&self.kind, req) {
            (
                Kind::Table {
                    key,
                    actions,
                    writable,
                },
                Request::Write { writes, .. },
            ) => {
                for w in writes {
                    let (k, entry) = match w {
                        Write::Insert(e) | Write::Modify(e) => (&e.key, Some(e)),
                        Write::Delete(k) => (k, None),
                    };
                    if !writable && entry.is_some() {
                        return Err(ControlError::ReadOnly {
                            table: self.name.clone(),
                        });
                    }
                    check_key(key, k)?;
                    if let Some(e) = entry {
                        self.action_index(actions, e)?;
                    }
                }
                Ok(())
            }
            (Kind::Table { key, .. }, Request::Read { key: Some(k), .. }) => check_key(key, k),
            (Kind::Table { key, .. }, Request::CountersOf { keys, .. }) => {
                keys.iter().try_for_each(|k| check_key(key, k))
            }
            (Kind::Table { .. }, Request::Read { key: None, .. }) | (_, Request::Stats { .. }) => {
                Ok(())
            }
            (Kind::Register { bits }, Request::ReadRegister { first, count, .. })
            | (Kind::Register { bits }, Request::WriteRegister { first, count, .. }) => {
                if let Request::WriteRegister { value, .. } = req {
                    Field::exact("value", *bits, Format::Int).check_value(*value)?;
                }
                self.check_range(*first, *count)
            }
            (Kind::Meters, Request::SetMeter { first, count, .. })
            | (Kind::Meters, Request::ReadMeter { first, count, .. }) => {
                if let Request::SetMeter { config, .. } = req
                    && let Some(why) = config.problem()
                {
                    return Err(ControlError::Invalid {
                        what: format!("meter `{}`", self.name),
                        why: why.to_string(),
                    });
                }
                self.check_range(*first, *count)
            }
            (Kind::Rules { tables }, Request::Flows { change, .. }) => {
                let table = match change {
                    FlowChange::Modify { filter, .. }
                    | FlowChange::Delete(filter)
                    | FlowChange::Dump(filter) => filter.table,
                    FlowChange::Replace { table, .. } => *table,
                    FlowChange::Add { .. } | FlowChange::Expire(_) => None,
                };
                match table {
                    Some(t) if t >= *tables => Err(ControlError::Invalid {
                        what: format!("`{}`", self.name),
                        why: format!(
                            "there is no table {t}: the pipeline has tables 0 to {}",
                            tables.saturating_sub(1)
                        ),
                    }),
                    _ => Ok(()),
                }
            }
            (_, _) => Err(ControlError::Invalid {
                what: format!("`{}`", self.name),
                why: format!("it is {}, and takes no such request", self.kind_name()),
            }),
        }
    }

    /// Checks that `count` (at least one) values from `first` lie inside the array.
    fn check_range(&self, first: usize, count: usize) -> Result<(), ControlError> {
        let end = first.saturating_add(count);
        if count == 0 || end > self.capacity {
            return Err(ControlError::OutOfRange {
                name: self.name.clone(),
                index: end.saturating_sub(1).max(first),
                size: self.capacity,
            });
        }
        Ok(())
    }

    fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::Table { .. } => "a table",
            Kind::Register { .. } => "a register",
            Kind::Meters => "a meter array",
            Kind::Rules { .. } => "a rule pipeline",
        }
    }

    /// The index of `entry`'s action, its parameters checked.
    pub fn action_index(&self, actions: &[Action], entry: &Entry) -> Result<usize, ControlError> {
        let Some(i) = actions.iter().position(|a| a.name == entry.action) else {
            return Err(ControlError::UnknownAction {
                table: self.name.clone(),
                action: entry.action.clone(),
                known: actions.iter().map(|a| a.name.clone()).collect(),
            });
        };
        let params = &actions[i].params;
        if params.len() != entry.params.len() {
            return Err(ControlError::Arity {
                what: format!("action `{}`", entry.action),
                expected: params.len(),
                got: entry.params.len(),
            });
        }
        for (p, &v) in params.iter().zip(&entry.params) {
            p.check_value(v)?;
        }
        Ok(i)
    }
}

fn check_key(fields: &[Field], key: &[Match]) -> Result<(), ControlError> {
    if fields.len() != key.len() {
        return Err(ControlError::Arity {
            what: "the key".to_string(),
            expected: fields.len(),
            got: key.len(),
        });
    }
    for (f, m) in fields.iter().zip(key) {
        let values: &[u128] = match (f.kind, m) {
            (MatchKind::Exact, Match::Exact(v)) => &[*v],
            (MatchKind::Lpm, Match::Prefix { value, len }) => {
                if *len > f.bits {
                    return Err(ControlError::Width {
                        field: format!("{} (prefix length)", f.name),
                        bits: f.bits,
                    });
                }
                &[*value]
            }
            (MatchKind::Ternary, Match::Ternary { value, mask }) => &[*value, *mask],
            (MatchKind::Range, Match::Range { low, high }) => &[*low, *high],
            (expected, _) => {
                return Err(ControlError::MatchKind {
                    field: f.name.clone(),
                    expected,
                });
            }
        };
        for &v in values {
            f.check_value(v)?;
        }
    }
    Ok(())
}

/// Positions a read covers per page (table slots for exact tables, entries for others):
/// bounds what a worker does between two bursts to answer a read, whatever the table's
/// size.
pub const READ_PAGE: usize = 8192;

/// The page of `items` (in a stable order) a read from position `from` covers.
pub fn page<T>(
    items: impl Iterator<Item = T>,
    from: usize,
    total: usize,
) -> (Vec<T>, Option<usize>) {
    let end = from.saturating_add(READ_PAGE);
    let items = items.skip(from).take(READ_PAGE).collect();
    (items, (end < total).then_some(end))
}

/// Why the control plane is told about an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotificationKind {
    /// Its idle time ran out; `deleted` says whether the table removed it (`AUTO_DELETE`)
    /// or kept it (`NOTIFY_CONTROL`).
    IdleTimeout { deleted: bool },
    /// The data plane asks the control plane to act on it (a digest).
    Digest,
    /// A rule left a rule pipeline (OpenFlow's flow-removed): the rule as it was, its
    /// counters summed over workers, and why. The notification's entry is empty.
    FlowRemoved {
        reason: RemovedReason,
        flow: FlowStat,
    },
}

/// A message from the data plane to control-plane subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    pub table: String,
    pub kind: NotificationKind,
    pub entry: Entry,
    pub at_ns: u64,
}

/// A meter's settings as the control plane gives them: rates in bytes per second, bursts in
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MeterConfig {
    /// No metering: every packet keeps its colour (green unless marked before).
    #[default]
    Off,
    SrTcm {
        cir: u64,
        cbs: u64,
        ebs: u64,
    },
    TrTcm {
        cir: u64,
        cbs: u64,
        pir: u64,
        pbs: u64,
    },
}

impl MeterConfig {
    /// Why the settings cannot work, if they cannot.
    pub fn problem(&self) -> Option<&'static str> {
        match *self {
            MeterConfig::Off => None,
            MeterConfig::SrTcm { cbs, ebs, .. } if cbs == 0 && ebs == 0 => {
                Some("srTCM needs a committed or an excess burst above 0 bytes")
            }
            MeterConfig::TrTcm { cir, pir, .. } if pir < cir => {
                Some("trTCM's peak rate (PIR) must be at least its committed rate (CIR), RFC 2698")
            }
            MeterConfig::TrTcm { cbs, pbs, .. } if cbs == 0 || pbs == 0 => {
                Some("trTCM needs committed and peak bursts above 0 bytes")
            }
            _ => None,
        }
    }
}
