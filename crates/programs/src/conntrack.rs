//! `conntrack`: TCP, UDP and ICMP echo connection tracking, with state kept by the data
//! plane itself.
//!
//! Each connection is an entry of an exact table keyed by its flow key in a canonical
//! orientation (both directions find the same entry). A new connection is added on the
//! miss (PNA add-on-miss: TCP on a SYN, UDP on any packet); its state is updated in place by
//! later packets; each state has its own idle timeout (an expiry profile, AUTO_DELETE),
//! restarted only where the state machine says so, as in PNA's TCP example:
//!
//! * TCP `new` (the originator's SYN seen) and `syn_recv` (the responder's SYN+ACK seen):
//!   the timer runs from the packet that entered the state; the originator's ACK after
//!   the SYN+ACK makes it `established`.
//! * `established`: every packet restarts the timer.
//! * `closing` (one side's FIN seen: the other may still send, a half-closed stream):
//!   every packet restarts the timer.
//! * `time_wait` (both sides' FINs seen): packets no longer restart the timer, so it ages
//!   out; in `closing` or `time_wait`, a SYN from the originator opens the connection
//!   again (a client reusing its port).
//! * A RST within the windows deletes the entry at once (a data-plane delete) when it
//!   starts exactly where its sender's next byte or its receiver's acknowledgement is
//!   (`window::resets`); elsewhere in the windows it passes and changes nothing.
//! * UDP: `udp` after the first packet, `udp_stream` once the other side answered; every
//!   packet restarts the timer.
//! * ICMP and ICMPv6 echo: `icmp`, opened by a request (the identifier is the connection's
//!   port on both sides); every packet restarts the timer.
//!
//! Packets are forwarded by the port map of `forward`. With `drop_invalid` (default true),
//! a TCP packet that is not a SYN and belongs to no connection is dropped (`invalid`),
//! except a RST, which only ever closes things and passes (as the repeated resets of a
//! peer that just reset a connection do), and so is an echo reply to no request; a
//! new connection that finds the table full is dropped (`table_full`). Other protocols
//! (and ICMP errors) pass untracked.
//!
//! With `window_checks` (default true), a TCP segment of a known connection must also lie
//! within its windows (`conntrack::window`: sequence and acknowledgement numbers, as pf
//! and Linux check them), else it is dropped (`out_of_window`) and changes nothing. The
//! windows live in the entry but not in what the control plane, sync and replicas see:
//! an entry installed from them is followed unchecked, as Linux follows a connection it
//! picks up.
//!
//! A full table makes room for a new connection (with `early_drop`, the default), as Linux
//! conntrack's early drop does: an expired entry near the new one's slot gives way, else
//! the unestablished or finished one (TCP `new`, `syn_recv` or `time_wait`, unanswered
//! `udp`) closest to expiry. A SYN or UDP flood then only displaces its own kind:
//! established connections keep their entries, and new legitimate ones still find room.
//!
//! State: one table per worker (workers own connections by the connection hash),
//! `connections`; it may be `synced`, and `replicated` (per connection, keyed by its
//! canonical orientation; its state and flags (answered, which sides sent a FIN), not its
//! packet count, so that only a move of its state writes to the store).
//! Configuration: `capacity` (per worker, default 65536), `map` (as `forward`),
//! `drop_invalid`, `early_drop` and `window_checks` (default true), and timeouts in seconds:
//! `new`, `syn_recv`, `established`, `closing`, `time_wait`, `udp`, `udp_stream`, `icmp`
//! (defaults 30, 30, 86400, 120, 120, 30, 120, 30: pf's `tcp.established` of a day, Linux's
//! FIN_WAIT and TIME_WAIT of two minutes, Linux's UDP).

use crate::forward::{Forward, ForwardConfig};
use crate::keys::filled_table;
use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, DropReason, PacketDesc, Program, Verdict};
use stateplane_state::control::{Field, Format};
use stateplane_state::{Carried, Declaration, DeclaredTable, NotLeased, ValueCodec, params_into};
use stateplane_wire::tcp::flags;
use stateplane_wire::{FlowKey, icmp};

mod window;
pub(crate) use window::Segment;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConntrackConfig {
    #[serde(default = "default_capacity")]
    pub capacity: usize,
    #[serde(default = "crate::default_true")]
    pub drop_invalid: bool,
    /// A full table drops an unestablished connection to make room for a new one.
    #[serde(default = "crate::default_true")]
    pub early_drop: bool,
    /// TCP sequence and acknowledgement numbers are checked against the connection's
    /// windows (false: Linux's `nf_conntrack_tcp_be_liberal`, for paths that carry one
    /// direction only past this switch).
    #[serde(default = "crate::default_true")]
    pub window_checks: bool,
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Output port per input port, as `forward`'s `map`.
    #[serde(default)]
    pub map: std::collections::BTreeMap<String, String>,
}

fn default_capacity() -> usize {
    65_536
}

/// Idle timeouts per state, in seconds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    pub new: f64,
    pub syn_recv: f64,
    pub established: f64,
    pub closing: f64,
    pub time_wait: f64,
    pub udp: f64,
    pub udp_stream: f64,
    pub icmp: f64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            new: 30.0,
            syn_recv: 30.0,
            established: 86_400.0,
            closing: 120.0,
            time_wait: 120.0,
            udp: 30.0,
            udp_stream: 120.0,
            icmp: 30.0,
        }
    }
}

impl Timeouts {
    /// `(name, seconds)` in `STATES` order: the expiry profiles' order.
    fn by_state(&self) -> [(&'static str, f64); STATES.len()] {
        let seconds = [
            self.new,
            self.established,
            self.closing,
            self.udp,
            self.udp_stream,
            self.icmp,
            self.syn_recv,
            self.time_wait,
        ];
        std::array::from_fn(|i| (STATES[i], seconds[i]))
    }
}

/// A connection's state; its discriminant is also its expiry profile's index. (States
/// added later go last, so that a state's number in the control API and in stores stays.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Zeroable)]
#[repr(u8)]
pub enum ConnState {
    /// The originator's SYN seen.
    #[default]
    New = 0,
    Established = 1,
    /// One side's FIN seen; the other may still send.
    Closing = 2,
    Udp = 3,
    UdpStream = 4,
    /// ICMP or ICMPv6 echo: a request opens it, replies belong to it.
    Icmp = 5,
    /// The responder's SYN+ACK seen, the originator's ACK not yet.
    SynRecv = 6,
    /// Both sides' FINs seen.
    TimeWait = 7,
}

/// State names in the control API, by `ConnState` discriminant.
const STATES: [&str; 8] = [
    "new",
    "established",
    "closing",
    "udp",
    "udp_stream",
    "icmp",
    "syn_recv",
    "time_wait",
];

impl ConnState {
    fn from_index(i: usize) -> ConnState {
        match i {
            1 => ConnState::Established,
            2 => ConnState::Closing,
            3 => ConnState::Udp,
            4 => ConnState::UdpStream,
            5 => ConnState::Icmp,
            6 => ConnState::SynRecv,
            7 => ConnState::TimeWait,
            _ => ConnState::New,
        }
    }
}

/// [`Conn::fins`] bits: which sides sent a FIN.
const FIN_FROM_ORIGINATOR: u8 = 1;
const FIN_FROM_RESPONDER: u8 = 2;

/// The control plane's view of the connection table: key the connection's canonical
/// 5-tuple and VLAN; action its state, with its packet count, whether it was answered,
/// whether its originator is the key's source and which sides sent a FIN (all of an entry
/// but its windows, so that an entry written back, as a migration does, is the one read).
pub(crate) struct ConnCodec;

impl ConnCodec {
    fn declaration(capacity: usize) -> Declaration {
        let params = vec![
            Field::exact("packets", 32, Format::Int),
            Field::exact("answered", 1, Format::Int),
            Field::exact("originator_is_src", 1, Format::Int),
            Field::exact("fins", 2, Format::Int),
        ];
        filled_table::<FlowKey>("connections", "", capacity, &STATES, params)
    }
}

impl ValueCodec for ConnCodec {
    type Key = FlowKey;
    type Value = Conn;

    fn value(action: usize, params: &[u128]) -> Conn {
        let p = |i: usize| params.get(i).copied().unwrap_or(0);
        Conn {
            state: ConnState::from_index(action),
            packets: p(0) as u32,
            answered: p(1) != 0,
            originator_is_canonical: p(2) != 0,
            fins: p(3) as u8 & (FIN_FROM_ORIGINATOR | FIN_FROM_RESPONDER),
            peers: [window::Peer::UNKNOWN; 2],
        }
    }

    fn action_values(conn: &Conn, out: &mut [u128]) -> (usize, usize) {
        let flag = |b: bool| u128::from(b);
        let params = [
            u128::from(conn.packets),
            flag(conn.answered),
            flag(conn.originator_is_canonical),
            u128::from(conn.fins),
        ];
        (conn.state as usize, params_into(params, out))
    }

    const COUNTING: &'static [&'static str] = &["packets"];

    /// A connection's expiry profile is its state's (the profiles are in `STATES` order).
    fn profile(conn: &Conn) -> u8 {
        conn.state as u8
    }
}

/// A connection's entry: what the data plane updates in place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct Conn {
    pub state: ConnState,
    /// Whether the originator's key is the canonical orientation.
    pub originator_is_canonical: bool,
    /// The responder's SYN+ACK (TCP) or any answer (UDP) was seen.
    pub answered: bool,
    pub packets: u32,
    /// Which sides sent a FIN (`FIN_FROM_ORIGINATOR`, `FIN_FROM_RESPONDER`).
    pub fins: u8,
    /// What window tracking knows of the originator (0) and the responder (1). Not part
    /// of the entry the control plane and replicas see: an entry written back or
    /// installed learns its windows from its next packets.
    pub(crate) peers: [window::Peer; 2],
}

const INVALID: DropReason = DropReason::program(1);
const TABLE_FULL: DropReason = DropReason::program(2);
const OUT_OF_WINDOW: DropReason = DropReason::program(3);

/// Why the tracker refuses a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It belongs to no connection, and the caller did not let it open one.
    Unknown,
    /// It belongs to no connection and cannot open one: TCP other than a SYN, an echo
    /// reply.
    Invalid,
    TableFull,
    /// A TCP segment outside its connection's windows ([`window`]).
    OutOfWindow,
    /// Its connection is replicated and not marked leased, and the replication stage did
    /// not admit the packet: left unprocessed, for the stage (`DropReason::NOT_LEASED`).
    NotLeased,
}

/// Whether ICMP key `key` is an echo request or reply (`Some(true)` for a request).
fn echo(key: &FlowKey) -> Option<bool> {
    let v6 = match (key.proto, key.ip_version) {
        (1, 4) => false,
        (58, 6) => true,
        _ => return None,
    };
    let t = (key.dst_port >> 8) as u8;
    icmp::types::is_echo(v6, t)
        .then_some(t == icmp::types::V4_ECHO_REQUEST || t == icmp::types::V6_ECHO_REQUEST)
}

/// Whether the tracker follows packets like this one: TCP, UDP and ICMP echo.
pub(crate) fn tracked(key: &FlowKey) -> bool {
    key.ip_version != 0 && (matches!(key.proto, 6 | 17) || echo(key).is_some())
}

/// The canonical orientation of a key (the lower endpoint first), port left out, and
/// whether the key was already in it. An echo's identifier stands for both ports, so a
/// request and its reply are one connection.
fn canonical(key: &FlowKey) -> (FlowKey, bool) {
    let mut k = *key;
    k.in_port = 0;
    if echo(key).is_some() {
        k.dst_port = k.src_port;
    }
    if (k.src, k.src_port) <= (k.dst, k.dst_port) {
        (k, true)
    } else {
        (k.reversed(), false)
    }
}

#[derive(Clone)]
pub struct Conntrack {
    forward: Forward,
    pub(crate) table: DeclaredTable<ConnCodec>,
    drop_invalid: bool,
    window_checks: bool,
    /// Expired connections by the state they were in (for tests and, later, counters).
    pub expired: [u64; STATES.len()],
}

impl Conntrack {
    pub fn new(
        cfg: &ConntrackConfig,
        ports: &PortNames,
        field: &str,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        crate::check_capacity(&format!("{field}.capacity"), cfg.capacity, "connections")?;
        let profiles =
            crate::idle_profiles(&format!("{field}.timeouts"), &cfg.timeouts.by_state())?;
        let mut table =
            crate::budgeted_table(&format!("{field}.capacity"), cfg.capacity, &profiles, seed)?;
        if cfg.early_drop {
            table.set_early_drop(&[
                ConnState::New as u8,
                ConnState::SynRecv as u8,
                ConnState::TimeWait as u8,
                ConnState::Udp as u8,
            ]);
        }
        Ok(Conntrack {
            forward: Forward::new(
                &ForwardConfig {
                    map: cfg.map.clone(),
                },
                ports,
                field,
            )?,
            table: DeclaredTable::new(table, ConnCodec::declaration(cfg.capacity)),
            drop_invalid: cfg.drop_invalid,
            window_checks: cfg.window_checks,
            expired: [0; STATES.len()],
        })
    }

    /// The state of the connection `key` belongs to (either direction), if tracked.
    pub fn state_of(&self, key: &FlowKey) -> Option<Conn> {
        self.table.get(&canonical(key).0).copied()
    }

    pub fn connections(&self) -> usize {
        self.table.len()
    }

    /// The connection a packet belongs to (either direction), as the table keys it: its
    /// replicated key. `None` for what the tracker does not follow.
    pub(crate) fn connection_of(&self, packet: &PacketDesc, _data: &[u8]) -> Option<FlowKey> {
        tracked(&packet.parsed.key).then(|| canonical(&packet.parsed.key).0)
    }

    /// Looks at `budget` slots for connections idle past their state's timeout.
    pub(crate) fn expire(&mut self, now: u64, budget: usize) {
        let expired = &mut self.expired;
        self.table
            .expire(now, budget, |_, conn| expired[conn.state as usize] += 1);
    }

    /// The TCP segment of packet `d` (frame `data`) when windows are checked: only then
    /// are a TCP packet's bytes read past what the parser gave.
    pub(crate) fn segment(&self, d: &PacketDesc, data: &[u8]) -> Option<Segment> {
        if self.window_checks && d.parsed.key.proto == 6 {
            Segment::read(d, data)
        } else {
            None
        }
    }

    /// Whether the connection of `key` (either direction) is tracked at `now`, and, for
    /// the `seq` of a TCP segment an ICMP error quotes as sent from `key`'s source,
    /// whether that segment lies within the connection's windows: read only, its timer
    /// left as it is.
    /// `lease_check`: as [`Conntrack::track`]'s.
    pub(crate) fn knows(
        &mut self,
        key: &FlowKey,
        seq: Option<u32>,
        now: u64,
        lease_check: Option<u16>,
    ) -> Result<bool, NotLeased> {
        let (ckey, is_canonical) = canonical(key);
        let Some(id) = self.table.lookup_leased(&ckey, now, lease_check)? else {
            return Ok(false);
        };
        let conn = self.table.value(id);
        Ok(match seq {
            Some(seq) if self.window_checks && key.proto == 6 => {
                let sender = usize::from(conn.originator_is_canonical != is_canonical);
                window::quoted(&conn.peers, sender, seq)
            }
            _ => true,
        })
    }

    /// Tracks one packet of a tracked kind (see [`tracked`]); a TCP packet's `segment`,
    /// when its header is whole, is checked against its connection's windows. One that
    /// belongs to no connection opens one if `may_open` and it can (a TCP SYN, UDP, an
    /// echo request); with `drop_invalid` off, one that cannot passes untracked. With
    /// the table replicated and checking leases, a packet whose `lease_check` says so
    /// (`PacketDesc::lease_check`) is refused ([`Refusal::NotLeased`]) unless its
    /// connection is marked leased.
    pub(crate) fn track(
        &mut self,
        key: &FlowKey,
        tcp_flags: u8,
        segment: Option<&Segment>,
        now: u64,
        may_open: bool,
        lease_check: Option<u16>,
    ) -> Result<(), Refusal> {
        let (ckey, is_canonical) = canonical(key);
        let tcp = key.proto == 6;
        let segment = segment.filter(|_| tcp && self.window_checks);
        let syn_only = tcp && tcp_flags & (flags::SYN | flags::ACK) == flags::SYN;
        let mut found = (self.table.lookup_leased(&ckey, now, lease_check))
            .map_err(|NotLeased| Refusal::NotLeased)?;
        if let Some(id) = found {
            let conn = self.table.value(id);
            if syn_only
                && conn.originator_is_canonical == is_canonical
                && matches!(conn.state, ConnState::Closing | ConnState::TimeWait)
            {
                // The originator opens the same 5-tuple again (a client reusing its port
                // after closing): the old connection is over, as in Linux's TIME_WAIT.
                self.table.delete(&ckey);
                found = None;
            }
        }
        let Some(id) = found else {
            return self.open(key, ckey, is_canonical, tcp_flags, segment, now, may_open);
        };
        let conn = self.table.value_mut(id);
        let from_originator = conn.originator_is_canonical == is_canonical;
        let rst = tcp && tcp_flags & flags::RST != 0;
        let mut ends = rst;
        if let Some(segment) = segment {
            let sender = usize::from(!from_originator);
            ends = rst && window::resets(&conn.peers, sender, segment.seq, conn.answered);
            if !window::check(&mut conn.peers, sender, segment, tcp_flags, conn.answered) {
                return Err(Refusal::OutOfWindow);
            }
        }
        if ends {
            self.table.delete(&ckey);
            return Ok(());
        }
        if rst {
            // Within the window but not at the next byte: it passes (its receiver answers
            // with a challenge ACK, RFC 5961) and the connection goes on as it was.
            return Ok(());
        }
        conn.packets = conn.packets.saturating_add(1);
        let before = conn.state;
        match conn.state {
            ConnState::New
                if !from_originator
                    && tcp_flags & (flags::SYN | flags::ACK) == flags::SYN | flags::ACK =>
            {
                conn.answered = true;
                conn.state = ConnState::SynRecv;
            }
            ConnState::SynRecv if from_originator && tcp_flags & flags::ACK != 0 => {
                conn.state = ConnState::Established;
            }
            ConnState::New
            | ConnState::SynRecv
            | ConnState::Established
            | ConnState::Closing
            | ConnState::TimeWait => {}
            ConnState::Udp if !from_originator => {
                conn.answered = true;
                conn.state = ConnState::UdpStream;
            }
            ConnState::Udp | ConnState::UdpStream => {}
            ConnState::Icmp => conn.answered |= !from_originator,
        }
        if tcp && tcp_flags & flags::FIN != 0 && conn.state != ConnState::New {
            conn.fins |= if from_originator {
                FIN_FROM_ORIGINATOR
            } else {
                FIN_FROM_RESPONDER
            };
            conn.state = if conn.fins == FIN_FROM_ORIGINATOR | FIN_FROM_RESPONDER {
                ConnState::TimeWait
            } else {
                ConnState::Closing
            };
        }
        let after = conn.state;
        if after != before {
            // A new state runs its own timeout from now (PNA set_entry_expire_time).
            let _ = self.table.set_profile(id, after as u8, now);
        } else if !matches!(
            after,
            ConnState::New | ConnState::SynRecv | ConnState::TimeWait
        ) {
            self.table.restart_timer(id, now);
        }
        Ok(())
    }

    /// A packet of no connection (canonical key `ckey`): opens one if `may_open` and the
    /// packet can.
    #[allow(clippy::too_many_arguments)]
    fn open(
        &mut self,
        key: &FlowKey,
        ckey: FlowKey,
        is_canonical: bool,
        tcp_flags: u8,
        segment: Option<&Segment>,
        now: u64,
        may_open: bool,
    ) -> Result<(), Refusal> {
        if !may_open {
            return Err(Refusal::Unknown);
        }
        let tcp = key.proto == 6;
        if tcp && tcp_flags & flags::RST != 0 {
            // A reset of a connection we do not (or no longer) track: let it through
            // (it only ever closes things) and keep no state for it.
            return Ok(());
        }
        let opens = match echo(key) {
            Some(request) => request,
            None => !tcp || (tcp_flags & (flags::SYN | flags::ACK)) == flags::SYN,
        };
        if !opens {
            return if self.drop_invalid {
                Err(Refusal::Invalid)
            } else {
                Ok(())
            };
        }
        let state = match key.proto {
            6 => ConnState::New,
            17 => ConnState::Udp,
            _ => ConnState::Icmp,
        };
        let mut conn = Conn {
            state,
            originator_is_canonical: is_canonical,
            answered: false,
            packets: 1,
            fins: 0,
            peers: Default::default(),
        };
        if let Some(segment) = segment {
            // A side's first segment is what its window is learnt from: it always fits.
            let fits = window::check(&mut conn.peers, 0, segment, tcp_flags, false);
            debug_assert!(fits, "a SYN opening a connection fits its fresh windows");
        }
        // The add-on-miss: the next packet of this connection hits the new entry.
        match self.table.add_entry(ckey, conn, state as u8, now) {
            Ok(_) => Ok(()),
            Err(_) => Err(Refusal::TableFull),
        }
    }
}

impl Conntrack {
    /// Takes `old`'s connections (a reload), each in its state, windows and timer, as
    /// many as the new capacity holds; the counts go on. Whatever the new configuration
    /// says of timeouts applies from a connection's next packet.
    pub(crate) fn inherit_connections(&mut self, old: &mut Conntrack) -> Carried {
        for (new, old) in self.expired.iter_mut().zip(old.expired) {
            *new += old;
        }
        self.table.adopt(&mut old.table)
    }
}

impl Program for Conntrack {
    type Prepared = ();

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        self.forward.process(burst, ctx);
        self.table.prefetch_keys(
            (burst.descs().iter())
                .filter(|d| tracked(&d.parsed.key))
                .map(|d| canonical(&d.parsed.key).0),
        );
        for i in 0..burst.len() {
            let d = &burst.descs()[i];
            let key = d.parsed.key;
            if !tracked(&key) {
                continue;
            }
            let segment = self.segment(d, burst.data(i));
            let flags = d.parsed.tcp_flags;
            let check = d.lease_check;
            let reason = match self.track(&key, flags, segment.as_ref(), d.ts_ns, true, check) {
                Ok(()) => continue,
                Err(Refusal::TableFull) => TABLE_FULL,
                Err(Refusal::Invalid | Refusal::Unknown) => INVALID,
                Err(Refusal::OutOfWindow) => OUT_OF_WINDOW,
                Err(Refusal::NotLeased) => DropReason::NOT_LEASED,
            };
            burst.descs_mut()[i].verdict = Verdict::Drop(reason);
        }
        self.expire(ctx.now_ns, crate::sweep_budget(burst.len()));
    }

    /// Idle live ports still time connections out: the sweep goes on between bursts.
    fn poll(&mut self, _out: &mut Burst, ctx: &mut Context) {
        self.expire(ctx.now_ns, crate::IDLE_SWEEP);
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &["no_mapping", "invalid", "table_full", "out_of_window"]
    }

    crate::answer_by_table!(table);

    crate::synced_tables::synced_table_methods!(table);

    crate::replicated_tables::replicated_table_methods!(
        table,
        with_counts: false,
        key: connection_of,
        leases_checked
    );

    fn inherit(&mut self, mut old: Self, _now_ns: u64) -> Vec<Carried> {
        vec![self.inherit_connections(&mut old)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_gen::build::{Hosts, L4, emit_frame};
    use stateplane_wire::FlowHasher;
    use stateplane_wire::ethernet::MacAddr;

    const S: u64 = 1_000_000_000;

    fn conntrack(capacity: usize) -> Conntrack {
        let names = PortNames(vec!["inside".into(), "outside".into()]);
        let cfg: ConntrackConfig = toml::from_str(&format!("capacity = {capacity}")).unwrap();
        Conntrack::new(&cfg, &names, "program.conntrack", 9).unwrap()
    }

    fn hosts(from_inside: bool) -> Hosts {
        let a = Hosts {
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            vlan: 0,
            src: "198.18.0.1".parse().unwrap(),
            dst: "198.19.0.2".parse().unwrap(),
            ttl: 64,
        };
        if from_inside {
            a
        } else {
            Hosts {
                src_mac: a.dst_mac,
                dst_mac: a.src_mac,
                src: a.dst,
                dst: a.src,
                ..a
            }
        }
    }

    /// Runs one packet through the program at time `t`; returns its verdict.
    fn send(c: &mut Conntrack, t: u64, from_inside: bool, l4: L4) -> Verdict {
        send_at(c, t, from_inside, l4, None)
    }

    /// As [`send`], the packet's lease checked at place `check` (`None`: admitted, or
    /// no lease checked).
    fn send_at(
        c: &mut Conntrack,
        t: u64,
        from_inside: bool,
        l4: L4,
        check: Option<u16>,
    ) -> Verdict {
        let mut f = Vec::new();
        emit_frame(&mut f, &hosts(from_inside), &l4, b"data");
        let mut burst = Burst::with_capacity(4);
        burst.push(&f, f.len() as u32, t, if from_inside { 0 } else { 1 }, 0);
        burst.now_ns = t;
        burst.parse(&FlowHasher::with_seed(1));
        burst.descs_mut()[0].lease_check = check;
        let mut ctx = crate::testutil::ctx(t, 2);
        c.process(&mut burst, &mut ctx);
        burst.descs()[0].verdict
    }

    /// Lets time pass at `t` with no traffic: empty bursts, enough for the sweep to see
    /// the whole (small) table.
    fn idle(c: &mut Conntrack, t: u64) {
        let mut ctx = crate::testutil::ctx(t, 2);
        for _ in 0..32 {
            let mut burst = Burst::with_capacity(1);
            burst.now_ns = t;
            c.process(&mut burst, &mut ctx);
        }
    }

    fn tcp(port: u16, from_inside: bool, f: u8) -> L4 {
        let (src_port, dst_port) = if from_inside { (port, 80) } else { (80, port) };
        L4::Tcp {
            src_port,
            dst_port,
            seq: 1,
            ack: 1,
            flags: f,
        }
    }

    fn state(c: &Conntrack, port: u16) -> Option<ConnState> {
        let key = FlowKey::v4(
            "198.18.0.1".parse().unwrap(),
            "198.19.0.2".parse().unwrap(),
            6,
            port,
            80,
        );
        c.state_of(&key).map(|conn| conn.state)
    }

    const OUT: Verdict = Verdict::Forward(1);
    const IN: Verdict = Verdict::Forward(0);

    /// The handshake, a day's quiet, a half-closed stream, both FINs and the TIME_WAIT
    /// timeout, on a virtual clock with the default timeouts.
    #[test]
    fn a_tcp_connection_goes_through_its_states_and_ages_out_after_both_fins() {
        let mut c = conntrack(64);
        assert_eq!(send(&mut c, S, true, tcp(1000, true, flags::SYN)), OUT);
        assert_eq!(state(&c, 1000), Some(ConnState::New), "added on the miss");
        let syn_ack = flags::SYN | flags::ACK;
        assert_eq!(send(&mut c, S + 1, false, tcp(1000, false, syn_ack)), IN);
        assert_eq!(state(&c, 1000), Some(ConnState::SynRecv));
        assert_eq!(send(&mut c, S + 2, true, tcp(1000, true, flags::ACK)), OUT);
        assert_eq!(state(&c, 1000), Some(ConnState::Established));
        // A packet every 20 hours keeps it past a day of established timeout.
        let hour = 3600 * S;
        for i in 1..=4 {
            let verdict = send(
                &mut c,
                S + i * 20 * hour,
                false,
                tcp(1000, false, flags::ACK),
            );
            assert_eq!(verdict, IN, "{} hours", i * 20);
        }
        let t = S + 80 * hour;
        send(&mut c, t, true, tcp(1000, true, flags::FIN | flags::ACK));
        assert_eq!(state(&c, 1000), Some(ConnState::Closing));
        // Half-closed: the responder streams on, each packet restarting the 120 s timer,
        // and the originator's FIN sent again moves nothing.
        for i in 1..=10 {
            let verdict = send(&mut c, t + i * 100 * S, false, tcp(1000, false, flags::ACK));
            assert_eq!(verdict, IN, "{} s after the first FIN", i * 100);
        }
        let t = t + 1000 * S;
        send(&mut c, t, true, tcp(1000, true, flags::FIN | flags::ACK));
        assert_eq!(state(&c, 1000), Some(ConnState::Closing));
        send(
            &mut c,
            t + S,
            false,
            tcp(1000, false, flags::FIN | flags::ACK),
        );
        assert_eq!(state(&c, 1000), Some(ConnState::TimeWait));
        // Both FINs seen: packets no longer restart the 120 s timer.
        send(&mut c, t + 60 * S, true, tcp(1000, true, flags::ACK));
        assert_eq!(state(&c, 1000), Some(ConnState::TimeWait));
        idle(&mut c, t + 120 * S);
        assert_eq!(state(&c, 1000), Some(ConnState::TimeWait));
        idle(&mut c, t + 122 * S);
        assert_eq!(state(&c, 1000), None);
        assert_eq!(c.expired[ConnState::TimeWait as usize], 1);
    }

    /// Each state ages out after its own timeout: an unanswered SYN, a SYN+ACK never
    /// acknowledged, a half-closed stream gone quiet.
    #[test]
    fn each_tcp_state_ages_out_after_its_own_timeout() {
        let mut c = conntrack(64);
        send(&mut c, S, true, tcp(1, true, flags::SYN));
        send(&mut c, S, true, tcp(2, true, flags::SYN));
        send(
            &mut c,
            11 * S,
            false,
            tcp(2, false, flags::SYN | flags::ACK),
        );
        for port in [3, 4] {
            send(&mut c, S, true, tcp(port, true, flags::SYN));
            send(&mut c, S, false, tcp(port, false, flags::SYN | flags::ACK));
            send(&mut c, S, true, tcp(port, true, flags::ACK));
        }
        send(&mut c, S, false, tcp(4, false, flags::FIN | flags::ACK));
        idle(&mut c, 32 * S);
        assert_eq!(state(&c, 1), None, "new: 30 s from the SYN");
        assert_eq!(
            state(&c, 2),
            Some(ConnState::SynRecv),
            "30 s from the SYN+ACK"
        );
        idle(&mut c, 42 * S);
        assert_eq!(state(&c, 2), None);
        assert_eq!(state(&c, 4), Some(ConnState::Closing));
        idle(&mut c, 122 * S);
        assert_eq!(state(&c, 4), None, "closing: 120 s from its last packet");
        assert_eq!(state(&c, 3), Some(ConnState::Established));
        let counted = |s: ConnState| c.expired[s as usize];
        assert_eq!(
            [ConnState::New, ConnState::SynRecv, ConnState::Closing].map(counted),
            [1, 1, 1]
        );
    }

    #[test]
    fn unknown_mid_stream_packets_are_invalid_and_a_rst_deletes() {
        let mut c = conntrack(64);
        let drop = Verdict::Drop(INVALID);
        assert_eq!(send(&mut c, S, false, tcp(1000, false, flags::ACK)), drop);
        send(&mut c, S, true, tcp(1000, true, flags::SYN));
        assert!(state(&c, 1000).is_some());
        // The SYN's sequence number is 1, and it carries 4 bytes: a refusal acknowledges
        // 1 + 4 + 1 (the SYN).
        let refusal = |ack| L4::Tcp {
            src_port: 80,
            dst_port: 1000,
            seq: 0,
            ack,
            flags: flags::RST | flags::ACK,
        };
        let out_of_window = Verdict::Drop(OUT_OF_WINDOW);
        assert_eq!(send(&mut c, S + 1, false, refusal(7)), out_of_window);
        assert_eq!(
            send(&mut c, S + 1, false, tcp(1000, false, flags::RST)),
            out_of_window,
            "no ACK"
        );
        assert!(state(&c, 1000).is_some());
        assert_eq!(send(&mut c, S + 1, false, refusal(6)), IN);
        assert_eq!(state(&c, 1000), None, "a RST deletes in the data plane");
        assert_eq!(send(&mut c, S + 2, true, tcp(1000, true, flags::ACK)), drop);
        assert_eq!(
            send(&mut c, S + 3, false, tcp(1000, false, flags::RST)),
            IN,
            "a repeated reset passes, and creates nothing"
        );
        assert_eq!(c.connections(), 0);
    }

    /// A reset within the window but off the next byte passes and leaves the connection
    /// as it was (its data goes on both ways); one at the next byte deletes it.
    #[test]
    fn only_a_reset_at_the_next_byte_ends_a_connection() {
        let mut c = conntrack(64);
        let segment = |from_inside: bool, seq: u32, ack: u32, flags: u8| {
            let (src_port, dst_port) = if from_inside { (1000, 80) } else { (80, 1000) };
            L4::Tcp {
                src_port,
                dst_port,
                seq,
                ack,
                flags,
            }
        };
        // Every frame carries 4 bytes; the SYN and SYN+ACK count one more each.
        assert_eq!(send(&mut c, S, true, segment(true, 1, 0, flags::SYN)), OUT);
        let answer = segment(false, 100, 6, flags::SYN | flags::ACK);
        assert_eq!(send(&mut c, S, false, answer), IN);
        assert_eq!(
            send(&mut c, S, true, segment(true, 6, 105, flags::ACK)),
            OUT
        );
        assert_eq!(state(&c, 1000), Some(ConnState::Established));
        let blind = segment(false, 105 + 2_000, 0, flags::RST);
        assert_eq!(send(&mut c, 2 * S, false, blind), IN, "within the window");
        assert_eq!(state(&c, 1000), Some(ConnState::Established));
        assert_eq!(
            send(&mut c, 3 * S, false, segment(false, 105, 10, flags::ACK)),
            IN
        );
        assert_eq!(
            send(&mut c, 3 * S, true, segment(true, 10, 109, flags::ACK)),
            OUT
        );
        let exact = segment(false, 109, 0, flags::RST);
        assert_eq!(send(&mut c, 4 * S, false, exact), IN);
        assert_eq!(state(&c, 1000), None, "the reset at the next byte ends it");
    }

    /// A generated internet trace of full-size frames, whose TCP senders stay within
    /// their windows as real ones do, goes through whole: window tracking refuses nothing
    /// a TCP sender sends (`drop_invalid` off, for flows whose SYN fell before the trace).
    #[test]
    fn a_generated_trace_is_within_its_windows() {
        use stateplane_gen::{GenConfig, Workload};
        let cfg = GenConfig::new(Workload::Internet, 300_000);
        let frames = crate::testutil::generated(&cfg);
        let names = PortNames(vec!["inside".into(), "outside".into()]);
        let conntrack: ConntrackConfig =
            toml::from_str("capacity = 1048576\ndrop_invalid = false").unwrap();
        let mut c = Conntrack::new(&conntrack, &names, "program.conntrack", 9).unwrap();
        let mut tcp_data = 0;
        for chunk in frames.chunks(64) {
            let mut burst = Burst::with_capacity(64);
            for (f, port) in chunk {
                burst.push(f, f.len() as u32, S, *port, 0);
            }
            burst.parse(&FlowHasher::with_seed(1));
            let mut ctx = crate::testutil::ctx(S, 2);
            c.process(&mut burst, &mut ctx);
            for (i, d) in burst.descs().iter().enumerate() {
                let segment = Segment::read(d, burst.data(i));
                tcp_data += usize::from(segment.is_some_and(|s| s.len > 1_000));
                assert_eq!(d.verdict, OUT, "packet {}", d.seq);
            }
        }
        assert!(tcp_data > 50_000, "{tcp_data} full TCP segments");
    }

    /// Connections past what the cache holds take the path that asks for a burst's slots
    /// first (`worth_prefetching`), and it tracks them as the other path does: each of
    /// 60,000 handshakes ends established, and a stranger's ACK is still refused.
    #[test]
    fn a_table_past_the_cache_tracks_every_connection() {
        let mut c = conntrack(1 << 17);
        let ports = 1..=60_000u16;
        for port in ports.clone() {
            assert_eq!(send(&mut c, S, true, tcp(port, true, flags::SYN)), OUT);
        }
        assert!(c.table.worth_prefetching(), "{}", c.connections());
        for port in ports.clone() {
            let answer = tcp(port, false, flags::SYN | flags::ACK);
            assert_eq!(send(&mut c, S, false, answer), IN);
            assert_eq!(send(&mut c, S, true, tcp(port, true, flags::ACK)), OUT);
        }
        assert!(
            ports
                .clone()
                .all(|p| state(&c, p) == Some(ConnState::Established))
        );
        assert_eq!(
            send(&mut c, S, true, tcp(60_001, true, flags::ACK)),
            Verdict::Drop(INVALID)
        );
    }

    /// An ACK a day and a minute after an established connection's last packet (its
    /// timeout is a day) belongs to no connection, though in a table this large the sweep
    /// has not reached the entry yet; a SYN then opens the connection again in the expired
    /// entry's place.
    #[test]
    fn a_connection_past_its_timeout_is_gone_before_the_sweep_reaches_it() {
        let mut c = conntrack(1 << 20);
        send(&mut c, S, true, tcp(1000, true, flags::SYN));
        send(&mut c, S, false, tcp(1000, false, flags::SYN | flags::ACK));
        send(&mut c, S, true, tcp(1000, true, flags::ACK));
        assert_eq!(state(&c, 1000), Some(ConnState::Established));
        let late = S + 86_460 * S;
        assert_eq!(
            send(&mut c, late, true, tcp(1000, true, flags::ACK)),
            Verdict::Drop(INVALID),
            "expired at the packet's time: a miss"
        );
        assert_eq!(
            send(&mut c, late + 1, true, tcp(1000, true, flags::SYN)),
            OUT
        );
        assert_eq!(
            state(&c, 1000),
            Some(ConnState::New),
            "opened again in its place"
        );
        idle(&mut c, late + 2);
        assert_eq!(
            c.expired[ConnState::Established as usize],
            1,
            "the expiry it replaced is counted"
        );
    }

    /// The words of a synced table, as a collector that took every change holds them.
    fn mirror_of(c: &mut Conntrack, mirror: &mut std::collections::BTreeMap<u32, u64>) {
        let mut changes = Vec::new();
        assert!(c.changes(&mut changes, usize::MAX));
        for ch in changes {
            assert_eq!(mirror.get(&ch.index).copied().unwrap_or(0), ch.old);
            mirror.insert(ch.index, ch.new);
        }
    }

    /// A synced connection table's changes rebuild its every word; written into another
    /// switch's table (another hash seed, so other slots), the connections go on there:
    /// an established connection's ACK passes where an unknown one is dropped, a
    /// half-open one is still new, and each keeps its count. Then a write that deletes one
    /// and a malformed one: the delete lands, the malformed entry is refused whole.
    #[test]
    fn a_synced_table_migrates_to_another_switch_with_every_connection() {
        // Action, key (two addresses of two words, proto, ports, vlan), packets, answered,
        // originator, FINs.
        let stride = 1 + 8 + 4;
        let mut a = conntrack(64);
        assert_eq!(
            Program::track(&mut a, "connections", 4),
            Some((a.table.slot_count() * stride) as u32)
        );
        for port in 1000..1040 {
            send(&mut a, S, true, tcp(port, true, flags::SYN));
            if port % 2 == 0 {
                send(&mut a, S, false, tcp(port, false, flags::SYN | flags::ACK));
                send(&mut a, S, true, tcp(port, true, flags::ACK));
            }
        }
        let mut mirror = std::collections::BTreeMap::new();
        mirror_of(&mut a, &mut mirror);
        for port in 1040..1050 {
            send(&mut a, 2 * S, true, tcp(port, true, flags::SYN));
        }
        send(&mut a, 2 * S, true, tcp(1000, true, flags::RST));
        mirror_of(&mut a, &mut mirror);
        let length = a.synced()[0].1;
        for index in 0..length {
            let word = mirror.get(&index).copied().unwrap_or(0);
            assert_eq!(a.read_synced(4, index), Some(word), "word {index}");
        }
        assert_eq!(a.read_synced(4, length), None);
        assert_eq!(a.read_synced(3, 0), None, "another id");

        let names = PortNames(vec!["inside".into(), "outside".into()]);
        let cfg: ConntrackConfig = toml::from_str("capacity = 64").unwrap();
        let mut b = Conntrack::new(&cfg, &names, "program.conntrack", 77).unwrap();
        Program::track(&mut b, "connections", 0);
        send(&mut b, 3 * S, true, tcp(5, true, flags::SYN)); // B's own, kept
        let mut written = 0;
        for slot in 0..length / stride as u32 {
            let word = |w: u32| mirror.get(&(slot * stride as u32 + w)).copied();
            if word(0).unwrap_or(0) != 0 {
                for w in 0..stride as u32 {
                    let index = slot * stride as u32 + w;
                    b.write_synced(0, index, word(w).unwrap_or(0)).unwrap();
                }
                written += 1;
            }
        }
        assert_eq!(written, 49, "40 + 10 opened, one reset");
        assert_eq!(b.commit_synced_write(), 0);
        assert_eq!(b.connections(), 50);
        assert_eq!(
            send(&mut b, 3 * S, true, tcp(1002, true, flags::ACK)),
            OUT,
            "an established connection goes on"
        );
        assert_eq!(state(&b, 1001), Some(ConnState::New));
        assert_eq!(state(&b, 1000), None, "reset before the move");
        assert_eq!(
            send(&mut b, 3 * S, true, tcp(2000, true, flags::ACK)),
            Verdict::Drop(INVALID),
            "one that never was is not"
        );
        let conn = |c: &Conntrack, port| {
            let key = FlowKey::v4(
                "198.18.0.1".parse().unwrap(),
                "198.19.0.2".parse().unwrap(),
                6,
                port,
                80,
            );
            c.state_of(&key).unwrap()
        };
        assert_eq!(
            ConnCodec::action(&conn(&b, 1004)),
            ConnCodec::action(&conn(&a, 1004)),
            "every field of the entry (its windows are learnt again)"
        );
        assert_eq!(conn(&b, 1002).packets, conn(&a, 1002).packets + 1);

        // The same connections taken ahead of the commit, as a migration's parts arrive
        // (the entries one after another from 0, the parts cut anywhere), after a write
        // dropped before its commit: each lands as the commit-time write placed it, and
        // nothing of the dropped one.
        let moved: Vec<u64> = (0..length / stride as u32)
            .filter(|&slot| mirror.get(&(slot * stride as u32)).is_some_and(|&w| w != 0))
            .flat_map(|slot| (0..stride as u32).map(move |w| slot * stride as u32 + w))
            .map(|index| mirror.get(&index).copied().unwrap_or(0))
            .collect();
        let mut c = Conntrack::new(&cfg, &names, "program.conntrack", 77).unwrap();
        Program::track(&mut c, "connections", 0);
        assert!(
            !Program::stage_synced_run(&mut c, 1, 0, &moved),
            "another id"
        );
        // The dropped write: three connections of ports of their own (word 6), after
        // where the next write's entries go.
        let mut dropped = moved[..3 * stride].to_vec();
        dropped
            .chunks_mut(stride)
            .for_each(|entry| entry[6] += 10_000);
        let after = moved.len() as u32;
        assert!(Program::stage_synced_run(&mut c, 0, after, &dropped));
        Program::drop_synced_write(&mut c);
        for (part, values) in moved.chunks(37).enumerate() {
            assert!(Program::stage_synced_run(
                &mut c,
                0,
                part as u32 * 37,
                values
            ));
        }
        assert_eq!(c.commit_synced_write(), 0);
        assert_eq!(c.connections(), 49, "none of the dropped write's");
        // A part taken again out of order after those before it were decoded ahead: what
        // was decoded ahead no longer holds, and each entry is placed once (five whole
        // in the first 74 words, the sixth cut off, refused).
        for (first, part) in [(0, &moved[..37]), (37, &moved[37..74]), (0, &moved[..37])] {
            assert!(Program::stage_synced_run(&mut c, 0, first, part));
        }
        let placed = c.table.commit_synced_write();
        assert_eq!((placed.entries, placed.refused), (5, 1));
        for port in 1000..1050 {
            let key = FlowKey::v4(
                "198.18.0.1".parse().unwrap(),
                "198.19.0.2".parse().unwrap(),
                6,
                port,
                80,
            );
            let action = |p: &Conntrack| p.state_of(&key).map(|c| ConnCodec::action(&c));
            assert_eq!(action(&c), action(&a), "port {port}");
        }

        // A delete (action word 0 with its key) and a malformed entry (a port past 16 bits),
        // made of B's own words for two of the connections (word 6: the source port).
        let key_of = |port: u64| {
            let slots = b.synced()[0].1 / stride as u32;
            let words = |slot: u32| -> Vec<u64> {
                (0..stride as u32)
                    .map(|w| b.read_synced(0, slot * stride as u32 + w).unwrap())
                    .collect()
            };
            (0..slots)
                .map(words)
                .find(|w| w[0] != 0 && w[6] == port)
                .unwrap()
        };
        let mut delete = key_of(1004);
        delete[0] = 0;
        let mut bad = key_of(1006);
        bad[7] = 1 << 16;
        // The delete goes twice: the second finds the key gone, which is no refusal.
        for (group, words) in [delete.clone(), bad, delete].iter().enumerate() {
            for (w, v) in words.iter().enumerate() {
                b.write_synced(0, (group * stride + w) as u32, *v).unwrap();
            }
        }
        assert_eq!(b.commit_synced_write(), 1, "the malformed entry");
        assert!(
            b.state_of(&FlowKey::v4(
                "198.18.0.1".parse().unwrap(),
                "198.19.0.2".parse().unwrap(),
                6,
                1004,
                80,
            ))
            .is_none()
        );
        assert_eq!(state(&b, 1006), Some(ConnState::Established), "untouched");
    }

    /// A synced table's write of many connections is staged and committed in memory the
    /// kernel supplied when the table was made resident (its staging, its saves of the
    /// entries before, the table itself): the worker's thread takes next to no page
    /// fault, where each 4 KiB filled the first time was one (some 5,000 here). Tracking
    /// alone supplies nothing: a copy built to check a configuration keeps no memory.
    #[test]
    fn a_large_write_into_a_synced_table_takes_no_page_fault() {
        let stride = 1 + 8 + 4;
        let mut a = conntrack(64);
        Program::track(&mut a, "connections", 4);
        send(&mut a, S, true, tcp(1000, true, flags::SYN));
        let mut mirror = std::collections::BTreeMap::new();
        mirror_of(&mut a, &mut mirror);
        let word = |index: usize| mirror.get(&(index as u32)).copied().unwrap_or(0);
        let slot = (0..a.table.slot_count()).find(|s| word(s * stride) != 0);
        let one: Vec<u64> = (0..stride)
            .map(|w| word(slot.unwrap() * stride + w))
            .collect();
        // 30,000 connections, each of its own source port (word 6).
        let connections = 30_000;
        let words: Vec<u64> = (0..connections)
            .flat_map(|i| {
                let mut entry = one.clone();
                entry[6] = 1 + i;
                entry
            })
            .collect();
        let names = PortNames(vec!["inside".into(), "outside".into()]);
        let cfg: ConntrackConfig = toml::from_str("capacity = 65536").unwrap();
        let mut b = Conntrack::new(&cfg, &names, "program.conntrack", 77).unwrap();
        let faults = crate::testutil::page_faults_of_this_thread();
        Program::track(&mut b, "connections", 0);
        let tracking = crate::testutil::page_faults_of_this_thread() - faults;
        assert!(tracking < 20, "{tracking} page faults to track");
        let resident = Program::synced_room_bytes(&b);
        // A write's 2^20 words, and the saves and places of its 80,659 slots.
        assert!(resident > 8 << 20, "{resident} bytes of room");
        Program::make_synced_resident(&mut b);
        let faults = crate::testutil::page_faults_of_this_thread();
        for (part, values) in words.chunks(4_000).enumerate() {
            let first = (part * 4_000) as u32;
            assert!(Program::stage_synced_run(&mut b, 0, first, values));
        }
        assert_eq!(b.commit_synced_write(), 0);
        let taken = crate::testutil::page_faults_of_this_thread() - faults;
        assert_eq!(b.connections(), connections as usize);
        assert!(taken < 20, "{taken} page faults");
    }

    #[test]
    fn idle_connections_expire_in_the_state_they_are_in() {
        let mut c = conntrack(64);
        send(&mut c, S, true, tcp(1000, true, flags::SYN));
        send(&mut c, S, false, tcp(1000, false, flags::SYN | flags::ACK));
        send(&mut c, S, true, tcp(1000, true, flags::ACK));
        send(&mut c, S, true, tcp(3000, true, flags::SYN)); // stays new
        idle(&mut c, 40 * S);
        assert_eq!(state(&c, 3000), None, "new connections time out after 30 s");
        assert_eq!(state(&c, 1000), Some(ConnState::Established));
        idle(&mut c, 86_402 * S);
        assert_eq!(state(&c, 1000), None, "established after a day idle");
        assert_eq!(c.expired[ConnState::New as usize], 1);
        assert_eq!(c.expired[ConnState::Established as usize], 1);
    }

    #[test]
    fn an_echo_request_opens_a_connection_its_replies_belong_to() {
        let mut c = conntrack(64);
        let echo = |request: bool, ident: u16| L4::IcmpEcho {
            request,
            ident,
            seq: 1,
        };
        assert_eq!(
            send(&mut c, S, false, echo(false, 9)),
            Verdict::Drop(INVALID),
            "a reply to no request"
        );
        assert_eq!(send(&mut c, S, true, echo(true, 9)), OUT);
        assert_eq!(send(&mut c, S + 1, false, echo(false, 9)), IN);
        assert_eq!(c.connections(), 1, "request and reply are one connection");
        let key = FlowKey::v4(
            "198.18.0.1".parse().unwrap(),
            "198.19.0.2".parse().unwrap(),
            1,
            9,
            8 << 8,
        );
        let conn = c.state_of(&key).unwrap();
        assert_eq!(
            (conn.state, conn.answered, conn.packets),
            (ConnState::Icmp, true, 2)
        );
        assert_eq!(
            send(&mut c, S + 2, false, echo(false, 10)),
            Verdict::Drop(INVALID),
            "another identifier is another connection"
        );
    }

    #[test]
    fn udp_becomes_a_stream_when_answered() {
        let mut c = conntrack(64);
        let udp = |from_inside: bool| {
            if from_inside {
                L4::Udp {
                    src_port: 5000,
                    dst_port: 53,
                }
            } else {
                L4::Udp {
                    src_port: 53,
                    dst_port: 5000,
                }
            }
        };
        send(&mut c, S, true, udp(true));
        let key = FlowKey::v4(
            "198.18.0.1".parse().unwrap(),
            "198.19.0.2".parse().unwrap(),
            17,
            5000,
            53,
        );
        assert_eq!(c.state_of(&key).map(|x| x.state), Some(ConnState::Udp));
        send(&mut c, S + 1, false, udp(false));
        let conn = c.state_of(&key).unwrap();
        assert_eq!((conn.state, conn.packets), (ConnState::UdpStream, 2));
    }

    /// A table full of established connections drops a new one by name; one holding
    /// finished or unestablished ones makes room (early drop), and a SYN flood at 10x the
    /// table leaves established connections tracked.
    #[test]
    fn a_full_table_drops_new_connections_by_name_unless_it_can_make_room() {
        let establish = |c: &mut Conntrack, port: u16| {
            assert_eq!(send(c, S, true, tcp(port, true, flags::SYN)), OUT);
            send(c, S, false, tcp(port, false, flags::SYN | flags::ACK));
            send(c, S, true, tcp(port, true, flags::ACK));
            assert_eq!(state(c, port), Some(ConnState::Established));
        };
        let mut c = conntrack(4);
        for port in 0..4 {
            establish(&mut c, port);
        }
        assert_eq!(
            send(&mut c, S, true, tcp(99, true, flags::SYN)),
            Verdict::Drop(TABLE_FULL)
        );
        assert_eq!(c.drop_reasons()[2], "table_full");
        // Two of them closed by both sides (`time_wait`): a new one takes one's place.
        for port in [0, 1] {
            send(&mut c, S, true, tcp(port, true, flags::FIN | flags::ACK));
            send(&mut c, S, false, tcp(port, false, flags::FIN | flags::ACK));
            assert_eq!(state(&c, port), Some(ConnState::TimeWait));
        }
        assert_eq!(send(&mut c, S, true, tcp(99, true, flags::SYN)), OUT);
        let states = [0, 1, 2, 3].map(|port| state(&c, port));
        assert_eq!(
            states.iter().filter(|s| s.is_none()).count(),
            1,
            "{states:?}"
        );
        assert_eq!(states[2..], [Some(ConnState::Established); 2]);
        // Half established, half a flood of SYNs that nobody answers.
        let mut c = conntrack(64);
        for port in 0..32 {
            establish(&mut c, port);
        }
        let taken = (1_000..1_640u16)
            .filter(|&port| send(&mut c, 2 * S, true, tcp(port, true, flags::SYN)) == OUT)
            .count();
        assert!(taken > 600, "{taken} of 640 flood SYNs tracked");
        assert!(c.connections() <= 64);
        for port in 0..32 {
            assert_eq!(state(&c, port), Some(ConnState::Established), "{port}");
            assert_eq!(send(&mut c, 3 * S, false, tcp(port, false, flags::ACK)), IN);
        }
    }

    /// The replicated key of one packet (as `send` builds it).
    fn key_of(c: &Conntrack, from_inside: bool, l4: L4) -> Option<stateplane_runtime::FlowBytes> {
        let mut f = Vec::new();
        emit_frame(&mut f, &hosts(from_inside), &l4, b"data");
        let mut burst = Burst::with_capacity(4);
        burst.push(&f, f.len() as u32, S, if from_inside { 0 } else { 1 }, 0);
        burst.parse(&FlowHasher::with_seed(1));
        c.replicated_key(&burst.descs()[0], burst.data(0))
    }

    /// As [`send_at`] at `S`.
    fn send_checked(c: &mut Conntrack, from_inside: bool, l4: L4, check: Option<u16>) -> Verdict {
        send_at(c, S, from_inside, l4, check)
    }

    /// Checking leases, the tracker processes a packet the stage did not admit only under
    /// its connection's mark, until the mark's time: no mark, a mark past or taken away,
    /// or no connection yet, and the packet is left as it came. What it found under the
    /// mark comes back with the packet's place, as a change only where the replicated
    /// state moved (an answer), not where a count did.
    #[test]
    fn a_connection_checked_for_its_lease_goes_under_its_mark_and_tells_its_changes() {
        let mut a = conntrack(16);
        assert!(!a.check_leases(), "not replicated");
        assert!(a.replicate("connections"));
        assert!(a.check_leases());
        let key = key_of(&a, true, tcp(7, true, flags::SYN)).unwrap();
        let syn = || tcp(7, true, flags::SYN);
        let left = Verdict::Drop(DropReason::NOT_LEASED);
        assert_eq!(send_checked(&mut a, true, syn(), Some(0)), left);
        assert_eq!(state(&a, 7), None, "a new connection waits for its lease");
        assert_eq!(send_checked(&mut a, true, syn(), None), OUT, "admitted");
        assert_eq!(state(&a, 7), Some(ConnState::New));
        assert_eq!(send_checked(&mut a, true, syn(), Some(0)), left, "no mark");

        a.set_lease_clock(1_000_000_000);
        a.mark_leased(&key, Some(2_000_000_000));
        assert_eq!(send_checked(&mut a, true, syn(), Some(3)), OUT);
        let mut found = Vec::new();
        assert_eq!(a.take_leased_changes(false, &mut found), 1);
        assert!(found.is_empty(), "a count is no change: {found:?}");
        assert_eq!(send_checked(&mut a, true, syn(), Some(4)), OUT);
        assert_eq!(a.take_leased_changes(true, &mut found), 1);
        let as_found = |place, changed| stateplane_runtime::LeasedPacket {
            flow: key,
            place,
            changed,
        };
        assert_eq!(found, [as_found(4, false)], "every one asked for");
        found.clear();
        let answer = tcp(7, false, flags::SYN | flags::ACK);
        assert_eq!(send_checked(&mut a, true, syn(), Some(1)), OUT);
        assert_eq!(send_checked(&mut a, false, answer, Some(2)), IN);
        assert_eq!(a.take_leased_changes(false, &mut found), 2);
        assert_eq!(
            found,
            [as_found(1, true), as_found(2, true)],
            "the answer moved it"
        );

        a.set_lease_clock(2_000_000_000);
        assert_eq!(
            send_checked(&mut a, true, syn(), Some(0)),
            left,
            "its time passed"
        );
        a.set_lease_clock(1_500_000_000);
        assert_eq!(send_checked(&mut a, true, syn(), Some(0)), OUT);
        a.mark_leased(&key, None);
        assert_eq!(
            send_checked(&mut a, true, syn(), Some(0)),
            left,
            "taken away"
        );
        a.mark_leased(&key, Some(2_000_000_000));
        let state = a.replicated_state(&key);
        assert!(a.install_replicated(&key, state.as_deref(), S));
        assert_eq!(
            send_checked(&mut a, true, syn(), Some(0)),
            left,
            "installed anew"
        );
    }

    /// Replicated, a connection is one flow whichever way its packets go; its state moves
    /// with its TCP state, never with its packet count (kept here), and installed in
    /// another tracker it lets that tracker pass the connection's answers. Bytes of no
    /// connection are refused, and another table's name is not taken.
    #[test]
    fn a_replicated_connection_is_keyed_both_ways_and_carries_its_state_not_its_count() {
        let mut a = conntrack(16);
        assert!(
            key_of(&a, true, tcp(7, true, flags::SYN)).is_none(),
            "not replicated yet"
        );
        assert!(!a.replicate("flows"));
        assert!(a.replicate("connections"));
        let key = key_of(&a, true, tcp(7, true, flags::SYN)).unwrap();
        assert_eq!(
            key_of(&a, false, tcp(7, false, flags::SYN | flags::ACK)),
            Some(key)
        );
        assert_ne!(key_of(&a, true, tcp(8, true, flags::SYN)), Some(key));
        assert_eq!(a.replicated_state(&key), None);

        assert_eq!(send(&mut a, S, true, tcp(7, true, flags::SYN)), OUT);
        let opened = a.replicated_state(&key).unwrap();
        assert_eq!(
            opened.len(),
            1 + 3 * 16,
            "state, then answered, originator and FINs: no count"
        );
        send(&mut a, S, true, tcp(7, true, flags::SYN));
        assert_eq!(
            a.replicated_state(&key),
            Some(opened.clone()),
            "a count is no change"
        );

        let mut b = conntrack(16);
        assert!(b.replicate("connections"));
        assert_eq!(
            send(&mut b, S, false, tcp(7, false, flags::SYN | flags::ACK)),
            Verdict::Drop(INVALID)
        );
        assert!(b.install_replicated(&key, Some(&opened), S));
        assert_eq!(state(&b, 7), Some(ConnState::New));
        assert_eq!(
            send(&mut b, S, false, tcp(7, false, flags::SYN | flags::ACK)),
            IN
        );
        assert_eq!(send(&mut b, S, true, tcp(7, true, flags::ACK)), OUT);
        assert_eq!(state(&b, 7), Some(ConnState::Established));
        let established = b.replicated_state(&key).unwrap();
        assert_ne!(established, opened);
        // Installed over a local entry, the state moves and the local count stays.
        let counted = b.state_of(&FlowKey::v4(
            "198.18.0.1".parse().unwrap(),
            "198.19.0.2".parse().unwrap(),
            6,
            7,
            80,
        ));
        assert!(b.install_replicated(&key, Some(&opened), S));
        let now = b.state_of(&FlowKey::v4(
            "198.18.0.1".parse().unwrap(),
            "198.19.0.2".parse().unwrap(),
            6,
            7,
            80,
        ));
        assert_eq!(
            now.map(|c| (c.state, c.packets)),
            counted.map(|c| (ConnState::New, c.packets))
        );

        assert!(
            !b.install_replicated(&key, Some(&opened[..17]), S),
            "a parameter short"
        );
        assert!(!b.install_replicated(&key, Some(&[9]), S), "no such state");
        assert!(b.install_replicated(&key, None, S));
        assert_eq!(state(&b, 7), None);

        // A full table refuses a flow's state, never evicting another flow's to make room.
        let names = PortNames(vec!["inside".into(), "outside".into()]);
        let cfg: ConntrackConfig = toml::from_str("capacity = 4\nearly_drop = false").unwrap();
        let mut full = Conntrack::new(&cfg, &names, "program.conntrack", 9).unwrap();
        assert!(full.replicate("connections"));
        let mut port = 100;
        while send(&mut full, S, true, tcp(port, true, flags::SYN)) == OUT {
            port += 1;
            assert!(port < 200, "a table of 4 fills");
        }
        let held = full.connections();
        let other = key_of(&full, true, tcp(7, true, flags::SYN)).unwrap();
        assert!(
            !full.install_replicated(&other, Some(&opened), S),
            "no room"
        );
        assert_eq!(full.connections(), held, "nothing evicted");
        assert_eq!(state(&full, 7), None);
    }
}
