//! The program interface: what a network function implements.
//!
//! A program sees a whole burst of parsed packets and sets each packet's [`Verdict`]. One
//! instance runs per worker, and each worker owns a shard of the flows (all packets of a
//! flow reach the same worker), so a program keeps its per-flow state in its own struct
//! with no locks. Malformed packets never reach a program: the runtime counts and drops
//! them first.

use crate::burst::{Burst, PacketDesc};
use stateplane_api::{Carried, Change, ControlError, Declaration, Notification, Reply, Request};
use stateplane_replication::FlowBytes;
use stateplane_wire::FlowHasher;
use std::any::Any;
use std::sync::Arc;

/// A port number: the index of the port in the switch's port list.
pub type PortId = u16;

/// Why a packet was dropped. Codes below [`DropReason::PROGRAM_BASE`] belong to the
/// runtime; a program's own reasons are `DropReason::program(i)`, named by the `i`-th entry
/// of its [`Program::drop_reasons`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DropReason(pub u8);

impl DropReason {
    /// The program set no verdict (a bug in the program, made visible in the counters).
    pub const NO_VERDICT: DropReason = DropReason(0);
    /// The packet failed to parse (counted by reason as well).
    pub const MALFORMED: DropReason = DropReason(1);
    /// The verdict named a port the switch does not have.
    pub const NO_SUCH_PORT: DropReason = DropReason(2);
    /// The frame was longer than `burst::MAX_FRAME`; refused at the port.
    pub const OVERSIZE: DropReason = DropReason(3);
    /// Replicated state: the output reflects a change the store did not acknowledge (in
    /// time, or at all: the flow's lease was lost), so it must not leave.
    pub const UNREPLICATED: DropReason = DropReason(4);
    /// Bounded replication: the store's latest snapshot is older than the staleness
    /// bound, and the run's `on_stale` action drops (or stopped serving).
    pub const STALE: DropReason = DropReason(5);
    /// Forwarded, but its port's output file did not take it: a timestamp the format
    /// cannot hold (pcap's ends in 2106), or the file failed (the run then stops). Counted
    /// as a drop, once per copy, and not as sent.
    pub const NOT_WRITTEN: DropReason = DropReason(6);
    /// Replicated state: the program left the packet unprocessed, its flow's entry not
    /// marked leased (`DeclaredTable::lookup_leased`), for the replication stage to admit
    /// and put in a later burst. The stage takes every such packet back: none leaves, and
    /// one that did would be counted here.
    pub const NOT_LEASED: DropReason = DropReason(7);
    pub const PROGRAM_BASE: u8 = 16;
    /// How many codes there are in all (runtime and program).
    pub const COUNT: usize = 64;

    const RUNTIME_NAMES: [&'static str; 8] = [
        "no_verdict",
        "malformed",
        "no_such_port",
        "oversize",
        "unreplicated",
        "stale",
        "not_written",
        "not_leased",
    ];

    /// The program's `i`-th reason. Programs have at most 48.
    pub const fn program(i: u8) -> DropReason {
        DropReason(Self::PROGRAM_BASE + i)
    }

    /// Whether the runtime or the program (by its list of names) names this reason.
    pub fn is_named(self, program_reasons: &[&'static str]) -> bool {
        match self.0.checked_sub(Self::PROGRAM_BASE) {
            None => usize::from(self.0) < Self::RUNTIME_NAMES.len(),
            Some(i) => usize::from(i) < program_reasons.len(),
        }
    }

    /// The name of this reason, given the program's list of names.
    pub fn name(self, program_reasons: &[&'static str]) -> &'static str {
        if self.0 < Self::PROGRAM_BASE {
            Self::RUNTIME_NAMES
                .get(usize::from(self.0))
                .copied()
                .unwrap_or("runtime_reserved")
        } else {
            program_reasons
                .get(usize::from(self.0 - Self::PROGRAM_BASE))
                .copied()
                .unwrap_or("program_unnamed")
        }
    }
}

/// What happens to a packet after the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send out of this port.
    Forward(PortId),
    /// Send a copy out of every port but the one it came in on (unknown destinations,
    /// broadcasts).
    Flood,
    /// Drop, for this reason.
    Drop(DropReason),
    /// Hand to the control plane (a packet-in), with a program-defined reason code.
    ToControl(u16),
}

impl Verdict {
    /// The ports this verdict sends a packet out of, for a packet that came in on
    /// `in_port` of a switch with `ports` ports. Every output stage (files, live queues,
    /// the benchmark's sink, the counters) goes through this one function.
    #[inline]
    pub fn out_ports(self, in_port: PortId, ports: usize) -> OutPorts {
        match self {
            Verdict::Forward(p) if usize::from(p) < ports => OutPorts {
                next: usize::from(p),
                end: usize::from(p) + 1,
                skip: usize::MAX,
            },
            Verdict::Flood => OutPorts {
                next: 0,
                end: ports,
                skip: usize::from(in_port),
            },
            _ => OutPorts {
                next: 0,
                end: 0,
                skip: usize::MAX,
            },
        }
    }
}

/// The output ports of a verdict, in port order (see [`Verdict::out_ports`]).
pub struct OutPorts {
    next: usize,
    end: usize,
    skip: usize,
}

impl Iterator for OutPorts {
    type Item = PortId;

    #[inline]
    fn next(&mut self) -> Option<PortId> {
        while self.next < self.end {
            let p = self.next;
            self.next += 1;
            if p != self.skip {
                return Some(p as PortId);
            }
        }
        None
    }
}

/// What the runtime tells a program about the burst it is processing.
pub struct Context {
    /// The data-plane clock: capture time offline, the system clock on live ports.
    pub now_ns: u64,
    /// This worker's index and the number of workers.
    pub worker: usize,
    pub workers: usize,
    /// The per-process flow hasher (for programs that hash other keys, e.g. symmetric).
    pub hasher: FlowHasher,
    /// How many ports the switch has; a `Forward` to a port at or past it is dropped.
    pub ports: usize,
    /// Whether each packet reached this worker by its `parsed.hash` (offline, and with one
    /// worker): then an ICMP error comes to the worker of the connection it quotes. On
    /// live ports with several workers the kernel spreads packets by its own hash, which
    /// keeps a flow's two directions together but sends an error by its own addresses.
    pub by_hash: bool,
}

impl Context {
    /// Worker 0 of 1 at `now_ns`, hashing with `hasher`, on a switch of `ports` ports: for
    /// benchmarks and tests that run a program by hand.
    pub fn one_worker(now_ns: u64, hasher: FlowHasher, ports: usize) -> Context {
        Context {
            now_ns,
            worker: 0,
            workers: 1,
            hasher,
            ports,
            by_hash: true,
        }
    }
}

/// A packet a program processed under its flow's lease mark
/// ([`Program::take_leased_changes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeasedPacket {
    pub flow: FlowBytes,
    /// Its place in its burst (`PacketDesc::lease_check`).
    pub place: u16,
    /// Whether its flow's replicated state may have changed since it was found.
    pub changed: bool,
}

/// A flow's replicated state read by `read` (a program's
/// [`Program::replicated_state_into`]) into a buffer of its own, with no place known:
/// [`Program::replicated_state`] for a program that encodes into a buffer.
pub fn state_alone(read: impl FnOnce(&mut Vec<u8>, &mut u32) -> Option<u64>) -> Option<Vec<u8>> {
    let mut state = Vec::new();
    let mut hint = crate::NO_HINT;
    read(&mut state, &mut hint).map(|_| state)
}

/// A network function. See the module documentation for the contract.
pub trait Program: Send {
    /// What [`Program::prepare`] makes for every worker's [`Program::control`]; `()` for a
    /// program that prepares nothing.
    type Prepared: Send + Sync + 'static;

    /// Sets the verdict of every packet in `burst` (all of them parsed and well formed).
    fn process(&mut self, burst: &mut Burst, ctx: &mut Context);

    /// Called on live ports about once a millisecond with `out` empty and `ctx.now_ns` the
    /// wall clock: the program may push packets of its own (probes, notifications) into
    /// `out`, each with its verdict set. Offline runs never call it.
    fn poll(&mut self, _out: &mut Burst, _ctx: &mut Context) {}

    /// Names of the program's drop reasons, indexed by `DropReason::program(i)`.
    fn drop_reasons(&self) -> &'static [&'static str] {
        &[]
    }

    /// Whether the program works on `workers` workers (on live ports, whose packets the
    /// kernel spreads, if `live`); a refusal says why and the fix. A run refuses to start
    /// rather than lose packets a program cannot handle on the worker they reach.
    fn check_workers(&self, _workers: usize, _live: bool) -> Result<(), String> {
        Ok(())
    }

    /// How live port `port` is to spread packets over several workers. A program that
    /// asks for anything but the flow hash gets it, or the run does not start (AF_XDP
    /// spreads by the NIC's hash and cannot), so `check_workers` may count on it.
    fn steering(&self, _port: PortId) -> crate::Steering {
        crate::Steering::Flow
    }

    /// The tables and registers the program keeps, as the control plane sees them.
    fn declarations(&self) -> Vec<Declaration> {
        Vec::new()
    }

    /// Runs on the control plane's thread before `request` goes to the workers, for work
    /// too heavy to do between two bursts: an updated copy of a table the workers share,
    /// which each worker's `control` then takes (a pointer swap). A refusal here reaches
    /// no worker. Called on an instance of its own, made by the same factory.
    fn prepare(&self, _request: &Request) -> Result<Option<Arc<Self::Prepared>>, ControlError> {
        Ok(None)
    }

    /// Answers a control-plane request between two bursts, with what `prepare` made. The
    /// request has passed [`Declaration::check`] against `declarations()`; a refusal must
    /// change nothing.
    fn control(
        &mut self,
        request: &Request,
        _prepared: Option<&Arc<Self::Prepared>>,
        _ctx: &Context,
    ) -> Result<Reply, ControlError> {
        Err(ControlError::UnknownTable {
            name: request.target().to_string(),
            known: Vec::new(),
        })
    }

    /// Moves the program's pending notifications (idle timeouts, digests) into `out`.
    fn notifications(&mut self, _out: &mut Vec<Notification>) {}

    /// Moves into `out` the requests the program makes of the control plane: changes its
    /// state needs on every worker at one version, as a client's are (a rule that
    /// expired). Each comes back to every worker's [`Program::control`]; until then,
    /// nothing has changed.
    fn requests(&mut self, _out: &mut Vec<Request>) {}

    /// Starts tracking the declared state `name` as synced state `id`: from then on the
    /// cells it changes are marked (`stateplane_state::changes`) for the sync stage's
    /// [`Program::changes`]. Returns the state's length in cells, or `None` if the program
    /// cannot track it (the configuration then refuses `synced` for it, rather than promise
    /// what nothing keeps).
    fn track(&mut self, _name: &str, _id: u16) -> Option<u32> {
        None
    }

    /// As [`Program::track`], for bounded replication's snapshots
    /// ([`Program::snapshot_begin`]) alone: the state's cells are marked for the snapshots,
    /// and [`Program::changes`] never takes them (a sync stage beside would take the marks
    /// the snapshots read). `None` if the program cannot snapshot it.
    fn track_snapshots(&mut self, _name: &str, _id: u16) -> Option<u32> {
        None
    }

    /// The bytes the tracked state keeps besides the state itself once made resident
    /// ([`Program::make_synced_resident`]: a table's staging of a top-down write and its
    /// saves of entries before their first write in a pass), in each copy: what the run's
    /// memory budget is told.
    fn synced_room_bytes(&self) -> u64 {
        0
    }

    /// Has the kernel supply now the pages of the tracked state and of its room, so that
    /// taking its changes and committing a large write later take no page fault. The
    /// sync stage of the worker that runs the copy calls it, before its first pass; a
    /// copy made to check the configuration never does, and keeps no memory it does not
    /// use.
    fn make_synced_resident(&mut self) {}

    /// Appends to `out` each cell of the tracked state whose value differs from the last
    /// call's (or from when tracking began), once, with both values: what the sync stage
    /// takes between bursts. A table's slots are taken until `budget` cells of it are
    /// appended (each table of a program within the budget; a register's or a sketch's
    /// cells are taken whole), the rest first at the next call: whether every change was
    /// taken.
    fn changes(&mut self, _out: &mut Vec<Change>, _budget: usize) -> bool {
        true
    }

    /// The state tracked so far, as `(id, length)` in the order it was tracked.
    fn synced(&self) -> Vec<(u16, u32)> {
        Vec::new()
    }

    /// The state tracked for snapshots ([`Program::track_snapshots`]), as
    /// [`Program::synced`] gives it; by default all the state tracked (a program that
    /// knows better, the guarantees' wrapper, tells the two apart).
    fn snapshotted(&self) -> Vec<(u16, u32)> {
        self.synced()
    }

    /// The words of one entry of synced state `id`: 1 for a register's cells, a slot's
    /// words for a table (what the sync stage announces, so that a collector knows which
    /// words make an entry).
    fn synced_stride(&self, _id: u16) -> u32 {
        1
    }

    /// The value at `index` of synced state `id` (what the anti-entropy refresh sends);
    /// `None` past its end or for an id not tracked.
    fn read_synced(&self, _id: u16, _index: u32) -> Option<u64> {
        None
    }

    /// As [`Program::read_synced`] for the values from `first` on, into `out`; how many
    /// were read (fewer past the state's end, none for an id not tracked). Override it
    /// where one value costs the reading of its neighbours (a table's slot, encoded whole).
    fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize {
        let mut read = 0;
        for o in out.iter_mut() {
            let index = u32::try_from(read).ok().and_then(|n| first.checked_add(n));
            match index.and_then(|index| self.read_synced(id, index)) {
                Some(value) => *o = value,
                None => break,
            }
            read += 1;
        }
        read
    }

    /// Writes `value` at `index` of synced state `id` (a top-down write, which the sync
    /// stage commits between two bursts); the value it replaced, or `None` (nothing
    /// written) past its end or for an id not tracked. A value wider than the state's
    /// cells never comes here from a run's sync stage (the guarantees' wrapper refuses
    /// and counts it); given one, a program cuts it to the cells' width.
    fn write_synced(&mut self, _id: u16, _index: u32, _value: u64) -> Option<u64> {
        None
    }

    /// Writes `values` at `first`, `first + 1`, ... of synced state `id`, each as
    /// [`Program::write_synced`] would (one past the state's end writes nothing). Override
    /// it where a run costs less than its values one at a time (a table stages them).
    fn write_synced_run(&mut self, id: u16, first: u32, values: &[u64]) {
        for (index, &value) in (first..).zip(values) {
            let _ = self.write_synced(id, index, value);
        }
    }

    /// Takes `values` at `first`, `first + 1`, ... of synced state `id` ahead of the
    /// write's commit, as [`Program::write_synced_run`] at the commit would, where the
    /// state holds a write until [`Program::commit_synced_write`] anyway (a table, which
    /// decodes its entries as they come so that the commit only places them); `false`,
    /// nothing taken, where values land as they are written (a register), or for an id
    /// not tracked.
    fn stage_synced_run(&mut self, _id: u16, _first: u32, _values: &[u64]) -> bool {
        false
    }

    /// Drops what [`Program::stage_synced_run`] took of a write that will not commit.
    fn drop_synced_write(&mut self) {}

    /// Starts a consistent snapshot of tracked state `id` as it is now, which
    /// [`Program::snapshot_read`] reads while packets go on changing the state (bounded
    /// replication's lazy snapshot); `false` if the program cannot snapshot `id` (the
    /// configuration then refuses bounded replication of it).
    fn snapshot_begin(&mut self, _id: u16) -> bool {
        false
    }

    /// The words of the snapshot of state `id` begun last, from `first` on, into `out`, as
    /// they were when it began; how many were read (fewer past the state's end).
    fn snapshot_read(&mut self, _id: u16, _first: u32, _out: &mut [u64]) -> usize {
        0
    }

    /// Whether any of cells `first .. first + len` of state `id` may differ in the
    /// snapshot begun last from the one begun before it (a reader may then keep what it
    /// read of them last time). `true` unless the program knows better.
    fn snapshot_changed(&self, _id: u16, _first: u32, _len: u32) -> bool {
        true
    }

    /// The words a program keeps beside the state it snapshots that give that state its
    /// meaning (`hh`: which sketch counts which tenant, the interval counted), taken whole
    /// as a snapshot begins and installed with it ([`Program::install_aside`]); keep them
    /// few. None by default.
    fn snapshot_aside(&self) -> Vec<u64> {
        Vec::new()
    }

    /// Installs words [`Program::snapshot_aside`] gave (of the same length).
    fn install_aside(&mut self, _words: &[u64]) {}

    /// Ends a top-down write whose values [`Program::write_synced`] took: a synced table
    /// places the write's entries now, each whole, by its key (a register's cells were
    /// written as they came). Returns the entries refused (words missing, fields that do
    /// not fit the declaration, a full table).
    fn commit_synced_write(&mut self) -> u64 {
        0
    }

    /// Starts keeping the declared state `name` as replicated state: per flow, by the key
    /// [`Program::replicated_key`] gives, its entry read and installed whole through the
    /// two methods below. `false` if the program cannot (the configuration then refuses
    /// `replicated` for it, rather than promise what nothing keeps).
    fn replicate(&mut self, _name: &str) -> bool {
        false
    }

    /// The flow of the replicated state that the packet reads or writes (`None`: it
    /// touches none, and goes through as it is). Must be the same for every packet of a
    /// flow, whichever way it travels, and read nothing but the packet (its descriptor and
    /// its bytes, `data`).
    fn replicated_key(&self, _packet: &PacketDesc, _data: &[u8]) -> Option<FlowBytes> {
        None
    }

    /// For a packet whose flow [`Program::replicated_key`] cannot name from what this
    /// switch holds: the alias by which the store knows it (`None`: none; the packet goes
    /// through as it is). A NAT's answer names its connection only through the
    /// translation, which another switch made: the answer's own key, the alias its
    /// translation was written with ([`Program::replicated_alias_of`]), finds it. A
    /// packet so named must not make state when the store knows no flow by it (it is then
    /// processed as a packet of no replicated flow).
    fn replicated_alias(&self, _packet: &PacketDesc, _data: &[u8]) -> Option<FlowBytes> {
        None
    }

    /// The alias written with the flow's state (`None`: none): for as long as the flow
    /// has it, the store resolves the alias to the flow. It must share the flow's hash tag
    /// ([`FlowBytes::tagged`]), so that one Redis Cluster slot holds both.
    fn replicated_alias_of(&self, _key: &FlowBytes) -> Option<FlowBytes> {
        None
    }

    /// The flow's replicated state, as bytes (`None`: the flow has none here).
    fn replicated_state(&self, _key: &FlowBytes) -> Option<Vec<u8>> {
        None
    }

    /// As [`Program::replicated_state`], appended to `out`, with when the state times out
    /// here (on the clock of `Context::now_ns`) unless a packet of its flow restarts its
    /// idle time: `u64::MAX` never (the default). `None`: no state, nothing appended.
    /// Override it where the state can be encoded without an allocation (the replication
    /// stage reads a flow's state after each burst of its packets), and where the state
    /// times out: the store is told, so that it does not grant back a state this switch
    /// let expire. `hint`: where the program last found the flow's state, as it left it
    /// there ([`NO_HINT`] at first), kept by the caller with the flow so that the next read
    /// can look there first; any value must be safe to give.
    fn replicated_state_into(
        &self,
        key: &FlowBytes,
        out: &mut Vec<u8>,
        _hint: &mut u32,
    ) -> Option<u64> {
        self.replicated_state(key)
            .map(|state| out.extend_from_slice(&state))
            .map(|()| u64::MAX)
    }

    /// Makes the flow's state `state` (`None`: removes it), replacing what the program
    /// holds: what the store granted with the flow's lease. `false`: the bytes are not a
    /// state of this program (nothing changed).
    fn install_replicated(
        &mut self,
        _key: &FlowBytes,
        _state: Option<&[u8]>,
        _now_ns: u64,
    ) -> bool {
        false
    }

    /// Has the program check, where it looks a packet's flow up, that the replication
    /// stage marked the flow leased ([`Program::mark_leased`]), and leave unprocessed
    /// (`DropReason::NOT_LEASED`) a packet whose flow is not marked and that the stage did
    /// not admit (`PacketDesc::admitted`), so that the stage looks at no other packet
    /// before the program. `false` (the default): the program cannot, and the stage
    /// admits each packet itself.
    fn check_leases(&mut self) -> bool {
        false
    }

    /// Marks the flow leased until `until_ns` on the stage's clock ([`Program::set_lease_clock`];
    /// `None`: not leased), where the program holds its state; nothing otherwise.
    fn mark_leased(&mut self, _key: &FlowBytes, _until_ns: Option<u64>) {}

    /// The stage's time, which lease marks are read against until the next call.
    fn set_lease_clock(&mut self, _now_ns: u64) {}

    /// Takes every lease mark away.
    fn clear_leases(&mut self) {}

    /// Appends the packets that found their flow under its lease mark since the last
    /// call, in order, of the flows whose replicated state may have changed since (or,
    /// with `every`, all of them); how many found their flow so.
    fn take_leased_changes(&mut self, _every: bool, _out: &mut Vec<LeasedPacket>) -> u64 {
        0
    }

    /// Takes what it can of the state of `old`, the instance this one replaces on a reload
    /// (made from the configuration as it was), and says, per piece of declared state,
    /// what came across and what was left behind and why ([`Carried`]). By default
    /// nothing comes across: every declaration of `old` starts afresh, and says so.
    fn inherit(&mut self, old: Self, _now_ns: u64) -> Vec<Carried>
    where
        Self: Sized,
    {
        old.declarations()
            .iter()
            .map(|d| Carried::afresh(&d.name, "this program starts its state afresh on a reload"))
            .collect()
    }
}

/// A program as the runtime holds it (`Box<dyn Running>`): any [`Program`], with what it
/// prepares in a [`Prepared`]. Implemented for every `Program`; nothing else implements it.
pub trait Running: Send {
    fn process(&mut self, burst: &mut Burst, ctx: &mut Context);
    fn poll(&mut self, out: &mut Burst, ctx: &mut Context);
    fn drop_reasons(&self) -> &'static [&'static str];
    fn check_workers(&self, workers: usize, live: bool) -> Result<(), String>;
    fn steering(&self, port: PortId) -> crate::Steering;
    fn declarations(&self) -> Vec<Declaration>;
    fn prepare(&self, request: &Request) -> Result<Option<Prepared>, ControlError>;
    fn control(
        &mut self,
        request: &Request,
        prepared: Option<&Prepared>,
        ctx: &Context,
    ) -> Result<Reply, ControlError>;
    fn notifications(&mut self, out: &mut Vec<Notification>);
    fn requests(&mut self, out: &mut Vec<Request>);
    fn track(&mut self, name: &str, id: u16) -> Option<u32>;
    fn track_snapshots(&mut self, name: &str, id: u16) -> Option<u32>;
    fn snapshotted(&self) -> Vec<(u16, u32)>;
    fn synced_room_bytes(&self) -> u64;
    fn make_synced_resident(&mut self);
    fn changes(&mut self, out: &mut Vec<Change>, budget: usize) -> bool;
    fn synced(&self) -> Vec<(u16, u32)>;
    fn synced_stride(&self, id: u16) -> u32;
    fn read_synced(&self, id: u16, index: u32) -> Option<u64>;
    fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize;
    fn write_synced(&mut self, id: u16, index: u32, value: u64) -> Option<u64>;
    fn write_synced_run(&mut self, id: u16, first: u32, values: &[u64]);
    fn stage_synced_run(&mut self, id: u16, first: u32, values: &[u64]) -> bool;
    fn drop_synced_write(&mut self);
    fn commit_synced_write(&mut self) -> u64;
    fn snapshot_begin(&mut self, id: u16) -> bool;
    fn snapshot_read(&mut self, id: u16, first: u32, out: &mut [u64]) -> usize;
    fn snapshot_changed(&self, id: u16, first: u32, len: u32) -> bool;
    fn snapshot_aside(&self) -> Vec<u64>;
    fn install_aside(&mut self, words: &[u64]);
    fn replicate(&mut self, name: &str) -> bool;
    fn replicated_key(&self, packet: &PacketDesc, data: &[u8]) -> Option<FlowBytes>;
    fn replicated_alias(&self, packet: &PacketDesc, data: &[u8]) -> Option<FlowBytes>;
    fn replicated_alias_of(&self, key: &FlowBytes) -> Option<FlowBytes>;
    fn replicated_state(&self, key: &FlowBytes) -> Option<Vec<u8>>;
    fn replicated_state_into(
        &self,
        key: &FlowBytes,
        out: &mut Vec<u8>,
        hint: &mut u32,
    ) -> Option<u64>;
    fn install_replicated(&mut self, key: &FlowBytes, state: Option<&[u8]>, now_ns: u64) -> bool;
    fn check_leases(&mut self) -> bool;
    fn mark_leased(&mut self, key: &FlowBytes, until_ns: Option<u64>);
    fn set_lease_clock(&mut self, now_ns: u64);
    fn clear_leases(&mut self);
    fn take_leased_changes(&mut self, every: bool, out: &mut Vec<LeasedPacket>) -> u64;
    /// [`Program::inherit`] from `old` when it is a program of the same type; else every
    /// declaration of `old` starts afresh, the reload having changed the program.
    fn inherit(&mut self, old: Box<dyn Running>, now_ns: u64) -> Vec<Carried>;
    /// The program as `Any`, for [`Running::inherit`] to see whether it is its type.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

/// What a program's [`Program::prepare`] made, on its way to every worker: the runtime
/// cannot name each program's type, so it carries it as `Any`, and only [`Running`] opens
/// it again, as the type it was made as.
#[derive(Clone)]
pub struct Prepared(Arc<dyn Any + Send + Sync>);

impl<P: Program + 'static> Running for P {
    #[inline]
    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        Program::process(self, burst, ctx);
    }

    fn poll(&mut self, out: &mut Burst, ctx: &mut Context) {
        Program::poll(self, out, ctx);
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        Program::drop_reasons(self)
    }

    fn check_workers(&self, workers: usize, live: bool) -> Result<(), String> {
        Program::check_workers(self, workers, live)
    }

    fn steering(&self, port: PortId) -> crate::Steering {
        Program::steering(self, port)
    }

    fn declarations(&self) -> Vec<Declaration> {
        Program::declarations(self)
    }

    fn prepare(&self, request: &Request) -> Result<Option<Prepared>, ControlError> {
        Ok(Program::prepare(self, request)?.map(|made| Prepared(made)))
    }

    /// The preparer and the workers are made by one factory, so what was prepared is
    /// `P::Prepared`, except when a reload replaced the program between the two: then the
    /// worker still runs the old one and the request is refused as made for another.
    fn control(
        &mut self,
        request: &Request,
        prepared: Option<&Prepared>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        let typed = match prepared {
            None => None,
            Some(Prepared(made)) => Some(
                Arc::clone(made)
                    .downcast::<P::Prepared>()
                    .map_err(|_| ControlError::Unavailable)?,
            ),
        };
        Program::control(self, request, typed.as_ref(), ctx)
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) {
        Program::notifications(self, out);
    }

    fn requests(&mut self, out: &mut Vec<Request>) {
        Program::requests(self, out);
    }

    fn track(&mut self, name: &str, id: u16) -> Option<u32> {
        Program::track(self, name, id)
    }

    fn track_snapshots(&mut self, name: &str, id: u16) -> Option<u32> {
        Program::track_snapshots(self, name, id)
    }

    fn snapshotted(&self) -> Vec<(u16, u32)> {
        Program::snapshotted(self)
    }

    fn synced_room_bytes(&self) -> u64 {
        Program::synced_room_bytes(self)
    }

    fn make_synced_resident(&mut self) {
        Program::make_synced_resident(self)
    }

    fn changes(&mut self, out: &mut Vec<Change>, budget: usize) -> bool {
        Program::changes(self, out, budget)
    }

    fn synced(&self) -> Vec<(u16, u32)> {
        Program::synced(self)
    }

    fn synced_stride(&self, id: u16) -> u32 {
        Program::synced_stride(self, id)
    }

    fn read_synced(&self, id: u16, index: u32) -> Option<u64> {
        Program::read_synced(self, id, index)
    }

    fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize {
        Program::read_synced_run(self, id, first, out)
    }

    fn write_synced(&mut self, id: u16, index: u32, value: u64) -> Option<u64> {
        Program::write_synced(self, id, index, value)
    }

    fn write_synced_run(&mut self, id: u16, first: u32, values: &[u64]) {
        Program::write_synced_run(self, id, first, values);
    }

    fn stage_synced_run(&mut self, id: u16, first: u32, values: &[u64]) -> bool {
        Program::stage_synced_run(self, id, first, values)
    }

    fn drop_synced_write(&mut self) {
        Program::drop_synced_write(self);
    }

    fn commit_synced_write(&mut self) -> u64 {
        Program::commit_synced_write(self)
    }

    fn snapshot_begin(&mut self, id: u16) -> bool {
        Program::snapshot_begin(self, id)
    }

    fn snapshot_read(&mut self, id: u16, first: u32, out: &mut [u64]) -> usize {
        Program::snapshot_read(self, id, first, out)
    }

    fn snapshot_changed(&self, id: u16, first: u32, len: u32) -> bool {
        Program::snapshot_changed(self, id, first, len)
    }

    fn snapshot_aside(&self) -> Vec<u64> {
        Program::snapshot_aside(self)
    }

    fn install_aside(&mut self, words: &[u64]) {
        Program::install_aside(self, words);
    }

    fn replicate(&mut self, name: &str) -> bool {
        Program::replicate(self, name)
    }

    #[inline]
    fn replicated_key(&self, packet: &PacketDesc, data: &[u8]) -> Option<FlowBytes> {
        Program::replicated_key(self, packet, data)
    }

    fn replicated_alias(&self, packet: &PacketDesc, data: &[u8]) -> Option<FlowBytes> {
        Program::replicated_alias(self, packet, data)
    }

    fn replicated_alias_of(&self, key: &FlowBytes) -> Option<FlowBytes> {
        Program::replicated_alias_of(self, key)
    }

    fn replicated_state(&self, key: &FlowBytes) -> Option<Vec<u8>> {
        Program::replicated_state(self, key)
    }

    #[inline]
    fn replicated_state_into(
        &self,
        key: &FlowBytes,
        out: &mut Vec<u8>,
        hint: &mut u32,
    ) -> Option<u64> {
        Program::replicated_state_into(self, key, out, hint)
    }

    fn install_replicated(&mut self, key: &FlowBytes, state: Option<&[u8]>, now_ns: u64) -> bool {
        Program::install_replicated(self, key, state, now_ns)
    }

    fn check_leases(&mut self) -> bool {
        Program::check_leases(self)
    }

    #[inline]
    fn mark_leased(&mut self, key: &FlowBytes, until_ns: Option<u64>) {
        Program::mark_leased(self, key, until_ns);
    }

    #[inline]
    fn set_lease_clock(&mut self, now_ns: u64) {
        Program::set_lease_clock(self, now_ns);
    }

    fn clear_leases(&mut self) {
        Program::clear_leases(self);
    }

    #[inline]
    fn take_leased_changes(&mut self, every: bool, out: &mut Vec<LeasedPacket>) -> u64 {
        Program::take_leased_changes(self, every, out)
    }

    fn inherit(&mut self, old: Box<dyn Running>, now_ns: u64) -> Vec<Carried> {
        let declared = old.declarations();
        match old.into_any().downcast::<P>() {
            Ok(old) => Program::inherit(self, *old, now_ns),
            Err(_) => declared
                .iter()
                .map(|d| Carried::afresh(&d.name, "the reload changed the program"))
                .collect(),
        }
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// Makes one program instance per worker (`worker index -> program`).
pub type ProgramFactory = Arc<dyn Fn(usize) -> Box<dyn Running> + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_ports_of_each_verdict() {
        let all = |v: Verdict, in_port| v.out_ports(in_port, 4).collect::<Vec<_>>();
        assert_eq!(all(Verdict::Forward(2), 0), [2]);
        assert_eq!(all(Verdict::Forward(9), 0), [], "no such port: nowhere");
        assert_eq!(
            all(Verdict::Flood, 1),
            [0, 2, 3],
            "every port but the ingress"
        );
        assert_eq!(all(Verdict::Drop(DropReason::NO_VERDICT), 1), []);
        assert_eq!(all(Verdict::ToControl(1), 1), []);
    }

    /// A program that prepares a `T` and answers with what it was handed.
    struct Preparing<T>(T);

    impl<T: Clone + Send + Sync + 'static + Into<u64>> Program for Preparing<T> {
        type Prepared = T;

        fn process(&mut self, _burst: &mut Burst, _ctx: &mut Context) {}

        fn prepare(&self, _request: &Request) -> Result<Option<Arc<T>>, ControlError> {
            Ok(Some(Arc::new(self.0.clone())))
        }

        fn control(
            &mut self,
            _request: &Request,
            prepared: Option<&Arc<T>>,
            _ctx: &Context,
        ) -> Result<Reply, ControlError> {
            let made = prepared.map(|p| T::clone(p).into());
            Ok(Reply::Values(made.into_iter().map(u128::from).collect()))
        }
    }

    /// What one instance prepares reaches another of its type as that type; an instance of
    /// another program (a reload between prepare and apply) refuses it rather than fail.
    #[test]
    fn prepared_state_arrives_typed_and_a_replaced_program_refuses_it() {
        let ctx = Context {
            now_ns: 0,
            worker: 0,
            workers: 1,
            hasher: FlowHasher::with_seed(1),
            ports: 1,
            by_hash: true,
        };
        let request = Request::Stats { table: "t".into() };
        let preparer: Box<dyn Running> = Box::new(Preparing(7u32));
        let made = preparer.prepare(&request).unwrap();
        let mut same: Box<dyn Running> = Box::new(Preparing(0u32));
        assert_eq!(
            same.control(&request, made.as_ref(), &ctx).unwrap(),
            Reply::Values(vec![7])
        );
        assert_eq!(
            same.control(&request, None, &ctx).unwrap(),
            Reply::Values(Vec::new())
        );
        let mut other: Box<dyn Running> = Box::new(Preparing(0u64));
        assert_eq!(
            other.control(&request, made.as_ref(), &ctx),
            Err(ControlError::Unavailable)
        );
    }
}
