//! A worker's side of replication (linearizable mode): which packets may be processed now,
//! which wait, and what to ask of the store.
//!
//! Call order, per burst: [`Replica::admit`] each packet of a replicated flow (process it
//! only on [`Admit::Process`]; a packet that names its flow only by an alias goes to
//! [`Replica::admit_alias`], and comes back as [`Event::Resolved`] to be admitted again);
//! [`Replica::processed`] each packet processed, with the flow's new state when the
//! packet changed it; then [`Replica::poll_transmit`] for the
//! burst's requests (a flow's changes within the burst are one write: group commit), and
//! [`Replica::poll_event`] until `None`. Answers from the store go to
//! [`Replica::handle_reply`], the clock to [`Replica::handle_timeout`] by
//! [`Replica::poll_timeout`]; after either, transmit and drain events again. Events must be
//! drained before the next packet is admitted.
//!
//! Invariants, per flow: packets are processed only while the flow's lease is held on this
//! side's conservative clock (a lease is taken to start when its request was first sent,
//! and to end `margin_ns` early); a packet's output is released only once every write it
//! saw or made is acknowledged, and after the outputs of the flow's packets before it; at
//! most one write is on its way, and the changes made meanwhile wait as one (the next
//! write carries the flow's latest state, not a list of changes).
//!
//! Must never: release an output whose state the store has not acknowledged; process a
//! packet without a lease; hold a packet past the park bound (it is dropped and counted;
//! the state it changed is still written).

use crate::protocol::{Holder, KEEP_FOREVER, Reply, Request};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::hash::Hash;

/// A packet, as the worker that holds it names it.
pub type Token = u64;

#[derive(Clone, Copy, Debug)]
pub struct ReplicaConfig {
    /// The lease asked for (the store holds it to its range).
    pub lease_ns: u64,
    /// This side takes its lease to end this much before the store's: the clocks' drift
    /// over a lease.
    pub margin_ns: u64,
    /// A request unanswered this long is sent again (doubling, to 16 times this), or
    /// longer once answers show the store slower: see [`RoundTrips`].
    pub retransmit_ns: u64,
    /// Packets held at most, for all flows; past it, a packet is dropped and counted.
    pub park_limit: usize,
    /// A packet held this long is dropped (its flow's store is unreachable or its lease
    /// is another's).
    pub park_timeout_ns: u64,
    /// Requests unanswered past which no lease is asked for: asks wait here, in order,
    /// until answers make room. A store offered more asks than it answers (a burst of
    /// flows new here) would queue them, and every request behind, ever longer; the
    /// writes and renewals of leases held would then reach it after their leases.
    /// Writes and renewals are never held back: their flows' leases run meanwhile.
    pub asks_from: usize,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            lease_ns: 1_000_000_000,
            margin_ns: 10_000_000,
            retransmit_ns: 20_000_000,
            park_limit: 65_536,
            park_timeout_ns: 2_000_000_000,
            asks_from: 512,
        }
    }
}

/// Where a flow is kept, so that the calls after the program find it without a lookup:
/// the replica's place for the flow, and the program's for its state (a hint the worker
/// reads the state with, `NO_HINT` until one is told). Any value is safe: one gone stale
/// costs a lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Places {
    pub flow: u32,
    pub state: u32,
}

impl Places {
    /// No place known.
    pub const NONE: Places = Places {
        flow: u32::MAX,
        state: crate::NO_HINT,
    };
}

/// What to do with a packet just arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Process it now (the flow's lease is held), then report it with
    /// [`Replica::processed`].
    Process,
    /// Hold it unprocessed: [`Event::Process`] or [`Event::Drop`] will name it.
    Parked,
    Dropped(DropReason),
}

/// What to do with a packet's output once processed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Send it now: what it saw is the store's.
    Now,
    /// Hold it: [`Event::Release`] or [`Event::Drop`] will name it.
    Parked,
    /// Drop it (the packet's change is still written).
    Dropped(DropReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// The park bound was reached.
    ParkFull,
    /// Held longer than `park_timeout_ns`.
    TimedOut,
    /// The flow's lease was lost (fenced) before its write was acknowledged: the write was
    /// not applied, so its output must never leave.
    Fenced,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event<K, V> {
    /// The flow's lease is held: its state is `value` (`None`: none yet, start afresh),
    /// which replaces any this worker holds, before its held packets are processed.
    /// `waited`: another holder's lease had to pass first; `value` is `Some` when the flow
    /// had state at the store (a migration, or this worker's own after its lease passed).
    Install {
        key: K,
        value: Option<V>,
        waited: bool,
    },
    /// Process this held packet now, then report it with [`Replica::processed`].
    Process { key: K, token: Token },
    /// Send this packet's output: the flow's state it reflects, write `seq` under lease
    /// `epoch`, is the store's.
    Release { token: Token, epoch: u64, seq: u64 },
    /// Drop this held packet, processed or not.
    Drop { token: Token, reason: DropReason },
    /// Forget the flow's state here: its lease was lost, and the store's is the flow's
    /// state (the next packet takes the lease again and installs it).
    Forget { key: K },
    /// The store says which flow this held packet's alias names (`None`: none): admit it
    /// again, by that flow's key; with none, the store holds no state it could reflect,
    /// so it is processed as a packet of no replicated flow.
    Resolved {
        alias: K,
        token: Token,
        flow: Option<K>,
    },
}

/// The replica's counters (per worker); gauges are named so.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaCounters {
    pub processed: u64,
    /// Outputs sent at once (nothing of their flow unacknowledged).
    pub released_at_once: u64,
    /// Outputs held, then sent.
    pub released_held: u64,
    pub dropped_park_full: u64,
    pub dropped_timed_out: u64,
    pub dropped_fenced: u64,
    /// Gauge: packets held now, and the most at once.
    pub parked_now: u64,
    pub parked_peak: u64,
    /// Changes folded into a write already waiting (group commit).
    pub coalesced: u64,
    pub writes: u64,
    pub acquires: u64,
    pub renewals: u64,
    pub retransmits: u64,
    /// Leases taken with state from the store (migrations: another holder's state, or this
    /// side's own after its lease passed at the store; not this side's lease asked for
    /// again while it ran there), and after waiting for another.
    pub migrated: u64,
    pub waited: u64,
    pub fenced: u64,
    /// Writes fenced (the lease had run out at the store: a store or link gone longer than
    /// it) and written after all under the lease taken again, nothing having been written
    /// meanwhile: their outputs left, none dropped.
    pub retaken: u64,
    /// Aliases asked of the store, and those that named a flow.
    pub resolves: u64,
    pub resolved: u64,
    /// Gauge: flows known.
    pub flows: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lease {
    None,
    /// Asked for (`first_sent_ns`: `None` until the request leaves; `nonce`: the ask's,
    /// which its answer repeats).
    Acquiring {
        first_sent_ns: Option<u64>,
        nonce: u64,
        sent_ns: u64,
        tries: u32,
        waited: bool,
    },
    /// Another holder's: ask again at `retry_ns`.
    Waiting {
        retry_ns: u64,
    },
    Held {
        epoch: u64,
        until_ns: u64,
    },
}

#[derive(Clone, Copy, Debug)]
enum Needs {
    /// To be processed once the lease is held.
    Lease,
    /// Processed; to be released once write `seq` is acknowledged.
    Seq(u64),
}

#[derive(Clone, Copy, Debug)]
struct Parked {
    token: Token,
    needs: Needs,
    since_ns: u64,
}

#[derive(Clone, Debug)]
struct InFlight<V> {
    seq: u64,
    value: V,
    first_sent_ns: u64,
    sent_ns: u64,
    tries: u32,
}

#[derive(Clone, Copy, Debug)]
struct Renewing {
    nonce: u64,
    first_sent_ns: u64,
    sent_ns: u64,
    tries: u32,
}

#[derive(Clone, Debug)]
struct Flow<K, V> {
    lease: Lease,
    /// The last write the store acknowledged (or held when it granted the lease).
    acked: u64,
    in_flight: Option<InFlight<V>>,
    /// The flow's latest state, not yet sent: the next write.
    pending: Option<V>,
    renewing: Option<Renewing>,
    parked: VecDeque<Parked>,
    /// Whether the flow is in the list of flows with something to send.
    queued: bool,
    /// The earliest deadline in the timer heap for this flow.
    armed_ns: Option<u64>,
    /// When a packet last came: a lease is renewed only for flows in use.
    used_ns: u64,
    /// The epoch of the last lease granted here (0: none yet).
    epoch: u64,
    /// Packets named by [`Event::Process`] not yet reported [`Replica::processed`]: the
    /// flow is in use while the worker has them (a backlog of many flows can take longer
    /// than a lease to work through), whenever they came.
    processing: u32,
    /// When the flow's state times out here unless a packet comes (as the last
    /// [`Replica::processed`] said; `u64::MAX`: never).
    lives_until_ns: u64,
    /// The flow's other name, written with its state ([`Replica::name_alias`]).
    alias: Option<K>,
    /// Where the worker's program last found the flow's state (opaque here; `NO_HINT`
    /// until told): handed back at admission, so that the state is read there first.
    hint: u32,
    /// The flow's state as the store has it and the program held it with nothing to
    /// write: installed with its lease (or what the program held instead, where it could
    /// not take it: [`Replica::program_holds`]), or its last write acknowledged. `None`:
    /// not known, so that the next state reported is written.
    known: Option<V>,
    /// Whether the flow may have a steady mark (set with each mark; false only once its
    /// mark, if any, is taken away): a flow that stays steady is not marked again.
    marked: bool,
    /// Whether the flow lost its lease (fenced) with changes of its own not yet written,
    /// and asks for it again to write them: they go under the new lease only if the store
    /// grants it with nothing written since (`acked` still its last, or `refused` applied
    /// under this side's lease, its answer lost); else they are given up.
    retaking: bool,
    /// The write on its way when the lease was lost, and the epoch it was sent under,
    /// while `retaking` (boxed: every flow has the field, few ever fill it).
    refused: Option<Box<(InFlight<V>, u64)>>,
}

/// Packets that name their flow only by an alias, held while the store says which flow
/// that is (one ask an alias, however many packets wait for it).
#[derive(Clone, Debug)]
struct Resolving {
    nonce: u64,
    /// `None` until the ask leaves.
    first_sent_ns: Option<u64>,
    sent_ns: u64,
    tries: u32,
    parked: VecDeque<(Token, u64)>,
    /// The packets at the front of `parked` that were held when the ask left: its answer
    /// is theirs. One that came after may have come after the store answered (its copy
    /// sent first, say), so an answer of no flow could be older than the packet, which
    /// then waits for an ask of its own.
    covered: usize,
    armed_ns: Option<u64>,
}

impl<K, V> Flow<K, V> {
    fn new(now_ns: u64) -> Self {
        Flow {
            lease: Lease::None,
            acked: 0,
            in_flight: None,
            pending: None,
            renewing: None,
            parked: VecDeque::new(),
            queued: false,
            armed_ns: None,
            used_ns: now_ns,
            epoch: 0,
            processing: 0,
            lives_until_ns: u64::MAX,
            alias: None,
            known: None,
            marked: false,
            retaking: false,
            refused: None,
            hint: crate::NO_HINT,
        }
    }

    /// The flow's latest state as this side knows it: the change waiting, else the write
    /// on its way, else the known one.
    fn latest(&self) -> Option<&V> {
        (self.pending.as_ref())
            .or(self.in_flight.as_ref().map(|w| &w.value))
            .or(self.known.as_ref())
    }

    /// What a write or renewal sent at `now_ns` tells the store of the state's life: the
    /// time left here, and the lease it runs on (packets within it restart the time left,
    /// and the store hears of them only at the next renewal).
    fn keep_ns(&self, now_ns: u64, lease_ns: u64) -> u64 {
        if self.lives_until_ns == u64::MAX {
            return KEEP_FOREVER;
        }
        (self.lives_until_ns.saturating_sub(now_ns)).saturating_add(lease_ns)
    }

    /// When the lease held at `now_ns` ends (`None`: none is).
    fn held_until(&self, now_ns: u64) -> Option<u64> {
        match self.lease {
            Lease::Held { until_ns, .. } if now_ns < until_ns => Some(until_ns),
            _ => None,
        }
    }

    /// The write a packet processed now depends on: the next one if a change waits, the
    /// one on its way, else the last acknowledged.
    fn depends_on(&self) -> u64 {
        let sent = self.in_flight.as_ref().map_or(self.acked, |w| w.seq);
        sent + u64::from(self.pending.is_some())
    }

    fn idle(&self) -> bool {
        self.in_flight.is_none() && self.pending.is_none() && self.renewing.is_none()
    }

    /// Until when, from `now_ns`, [`Replica::admit`] would answer the flow's packets
    /// `Process` with nothing else to do, as long as nothing else happens to the flow
    /// (`None`: not now): its lease held past the time its renewal comes due (and so past
    /// the reach of a write made before then), nothing of it waiting or on its way, no
    /// packet of it parked or with the worker.
    fn steady_until(&self, now_ns: u64, lease_ns: u64) -> Option<u64> {
        let renewal_due_ns = self.held_until(now_ns)?.saturating_sub(lease_ns / 2);
        let steady = self.idle()
            && !self.queued
            && self.parked.is_empty()
            && self.processing == 0
            && now_ns < renewal_due_ns;
        steady.then_some(renewal_due_ns)
    }

    /// The flow's requests sent and not yet answered.
    fn unanswered(&self) -> usize {
        let asking = matches!(
            self.lease,
            Lease::Acquiring {
                first_sent_ns: Some(_),
                ..
            }
        );
        usize::from(self.in_flight.is_some())
            + usize::from(self.renewing.is_some())
            + usize::from(asking)
    }

    /// Asks for the lease (again) at the next transmit; `waited`: another holder's lease
    /// had to pass first.
    fn ask(&mut self, key: K, now_ns: u64, waited: bool, sendable: &mut Vec<K>) {
        self.lease = Lease::Acquiring {
            first_sent_ns: None,
            nonce: 0,
            sent_ns: now_ns,
            tries: 0,
            waited,
        };
        if !self.queued {
            self.queued = true;
            sendable.push(key);
        }
    }
}

#[cfg_attr(test, derive(Clone))]
pub struct Replica<K, V> {
    config: ReplicaConfig,
    holder: Holder,
    flows: crate::flow_table::FlowTable<K, Flow<K, V>>,
    /// Aliases being asked of the store, with their packets; and those whose ask is to go.
    resolving: crate::FlowMap<K, Resolving>,
    to_resolve: Vec<K>,
    /// The aliases of the flows known here (each flow's `alias`), so that a packet named
    /// by one is admitted by its flow's key without asking the store again.
    aliases: crate::FlowMap<K, K>,
    /// Packets held while their alias is asked of the store (counted in `parked` too).
    parked_by_alias: usize,
    /// Flows with something to send at the next [`Replica::poll_transmit`].
    sendable: Vec<K>,
    /// Flows whose ask waits for fewer requests unanswered (`asks_from`), in order.
    asks_waiting: VecDeque<K>,
    /// The flows' requests sent and not yet answered (each flow's
    /// [`Flow::unanswered`], summed).
    unanswered: usize,
    timers: BinaryHeap<Reverse<(u64, K)>>,
    /// Requests made by timers, ready to go.
    outbox: Vec<Request<K, V>>,
    events: VecDeque<Event<K, V>>,
    parked: usize,
    /// The next ask's or renewal's nonce.
    nonce: u64,
    round_trips: RoundTrips,
    /// When requests were first sent (one entry an exchange that sent any), from the
    /// earliest that may be unanswered: those sent before the latest-sent answered are
    /// taken out. Its front is the oldest unanswered request's sending.
    sent_unanswered: VecDeque<u64>,
    pub counters: ReplicaCounters,
}

/// How long the store takes to answer, smoothed as TCP does (RFC 6298), and what its
/// answers show of the requests still unanswered, so that a request is sent again only
/// once it is overdue for this store under its present load: a busy store answers late,
/// and sending it every request again would only add to its work. Each answer's time is
/// measured from its request's first sending (an answer to a request sent again may be
/// to either sending; taking the longer errs towards waiting).
#[derive(Clone, Copy, Debug, Default)]
struct RoundTrips {
    smoothed_ns: u64,
    variation_ns: u64,
    measured: bool,
    /// When the store last answered anything.
    answered_ns: u64,
    /// The first sending of the latest-sent request answered.
    answered_sent_ns: u64,
}

impl RoundTrips {
    /// A request first sent at `first_sent_ns` is answered at `now_ns`.
    fn answered(&mut self, now_ns: u64, first_sent_ns: u64) {
        self.answered_sent_ns = self.answered_sent_ns.max(first_sent_ns);
        self.sample(now_ns.saturating_sub(first_sent_ns));
    }

    /// When a request last sent at `sent_ns` is to be sent again, `wait_ns` being its
    /// timeout: once a request sent after it has been answered (as TCP's RACK, RFC 8985,
    /// takes a later segment's delivery as evidence of loss), else once the store has
    /// been silent that long. A store that answers in order (Redis, over one connection)
    /// answers a request before any sent after it, so while it keeps answering, however
    /// far behind, nothing is sent again: a queue at the store is waited out, not added to.
    fn resend_at(&self, sent_ns: u64, wait_ns: u64) -> u64 {
        let since = if self.answered_sent_ns > sent_ns {
            sent_ns
        } else {
            sent_ns.max(self.answered_ns)
        };
        since.saturating_add(wait_ns)
    }

    fn sample(&mut self, took_ns: u64) {
        if !self.measured {
            (self.smoothed_ns, self.variation_ns, self.measured) = (took_ns, took_ns / 2, true);
            return;
        }
        let deviation = self.smoothed_ns.abs_diff(took_ns);
        self.variation_ns = (3 * self.variation_ns + deviation) / 4;
        self.smoothed_ns = (7 * self.smoothed_ns + took_ns) / 8;
    }

    /// The wait before a first sending again: at least `floor`, at most `ceiling`, and
    /// `ceiling` until an answer has been measured (as TCP starts at a second: the first
    /// requests of a run may all go at once, and a store takes a while over them).
    fn timeout(&self, floor: u64, ceiling: u64) -> u64 {
        if !self.measured {
            return ceiling.max(floor);
        }
        let estimate = self.smoothed_ns.saturating_add(4 * self.variation_ns);
        estimate.min(ceiling).max(floor)
    }
}

impl<K: Copy + Eq + Hash + Ord, V: Clone + Default> Replica<K, V> {
    /// The bytes a replica keeps whatever its flows: its flows' steady marks.
    pub const FIXED_BYTES: usize = crate::flow_table::FlowTable::<K, Flow<K, V>>::STEADY_BYTES;

    pub fn new(holder: Holder, config: ReplicaConfig) -> Self {
        Replica {
            config,
            holder,
            flows: Default::default(),
            resolving: crate::FlowMap::default(),
            to_resolve: Vec::new(),
            aliases: crate::FlowMap::default(),
            parked_by_alias: 0,
            sendable: Vec::new(),
            asks_waiting: VecDeque::new(),
            unanswered: 0,
            timers: BinaryHeap::new(),
            outbox: Vec::new(),
            events: VecDeque::new(),
            parked: 0,
            nonce: 0,
            round_trips: RoundTrips::default(),
            sent_unanswered: VecDeque::new(),
            counters: ReplicaCounters::default(),
        }
    }

    pub fn holder(&self) -> Holder {
        self.holder
    }

    /// Whether this side holds `key`'s lease at `now_ns` (it would process its packets).
    pub fn holds(&self, key: &K, now_ns: u64) -> bool {
        self.flows
            .get(key)
            .and_then(|f| f.held_until(now_ns))
            .is_some()
    }

    /// A packet of flow `key` arrived: its places if the flow is steady (its packets are
    /// processed with nothing else to do, [`Admit::Process`] without a lookup), else
    /// `None` and nothing done (ask [`Replica::admit_placed`]). Established flows whose
    /// state only their packets read are steady between their lease's renewals.
    #[inline]
    pub fn admit_steady(&mut self, now_ns: u64, key: &K) -> Option<Places> {
        let (flow, state) = self.flows.steady(key, now_ns)?;
        self.counters.processed += 1;
        Some(Places { flow, state })
    }

    /// Reports from now on every flow marked steady, with until when
    /// ([`Replica::admit_steady`] would admit its packets so), and every mark taken away,
    /// for a program that admits those packets itself ([`Replica::take_steady_told`]):
    /// one whose packets, marked, are processed with nothing asked here, and whose changes
    /// come through [`Replica::processed_with_state`].
    pub fn tell_steady(&mut self) {
        self.flows.tell_program();
    }

    /// The steady marks made (`Some(until)`) and taken away (`None`) since the last call,
    /// in order (a flow's last stands), once [`Replica::tell_steady`] was called.
    pub fn take_steady_told(&mut self, out: &mut Vec<(K, Option<u64>)>) {
        self.flows.take_told(out);
    }

    /// Until when flow `key` is steady at `now_ns`, if it is, for the program to mark it
    /// so at once (told as well, [`Replica::take_steady_told`], and taken away as any
    /// mark): for a flow whose told mark the program did not take (packets of it were
    /// held).
    pub fn steady_for_program(&mut self, key: &K, now_ns: u64) -> Option<u64> {
        self.tell_if_steady(*key, now_ns)
    }

    /// Packets processed under their flow's steady mark with nothing asked here (a
    /// program told of the marks, [`Replica::tell_steady`]): counted as admitted.
    pub fn admitted_steady(&mut self, packets: u64) {
        self.counters.processed += packets;
    }

    /// A packet of flow `key` arrived.
    pub fn admit(&mut self, now_ns: u64, key: K, token: Token) -> Admit {
        self.admit_placed(now_ns, key, token).0
    }

    /// As [`Replica::admit`], with where the flow is kept: the replica's place for it,
    /// and where the program last had its state, as [`Replica::processed_with_state`]
    /// was told; both for that call after the program.
    pub fn admit_placed(&mut self, now_ns: u64, key: K, token: Token) -> (Admit, Places) {
        let horizon = now_ns.saturating_add(self.reach_ns(now_ns));
        let lease_ns = self.config.lease_ns;
        let (flow, place) = self.flows.get_or_insert_with(key, || Flow::new(now_ns));
        flow.used_ns = now_ns;
        let places = Places {
            flow: place,
            state: flow.hint,
        };
        let waiting_for_lease =
            matches!(flow.parked.back(), Some(p) if matches!(p.needs, Needs::Lease));
        // A write made now would reach the store after the lease: ask for it again first
        // (with a write or renewal on its way, its answer extends the lease before the
        // next write goes; with packets handed to the worker, they are processed under
        // this lease, which must not end under them). Once granted, the packets are
        // processed however long the answer took: asking again could not make the lease
        // longer.
        if !waiting_for_lease && let Some(until_ns) = flow.held_until(now_ns) {
            if !flow.idle() || flow.processing > 0 || until_ns > horizon {
                self.counters.processed += 1;
                // Renewed only if the renewal can reach the store within the lease.
                if flow.idle()
                    && !flow.queued
                    && until_ns > horizon
                    && renewal_due(now_ns, until_ns, lease_ns)
                {
                    flow.queued = true;
                    self.sendable.push(key);
                }
                if let Some(steady_ns) = flow.steady_until(now_ns, lease_ns) {
                    flow.marked = true;
                    self.flows.mark_steady(key, place, steady_ns, places.state);
                }
                return (Admit::Process, places);
            }
            flow.ask(key, now_ns, false, &mut self.sendable);
        }
        if self.parked >= self.config.park_limit {
            self.counters.dropped_park_full += 1;
            return (Admit::Dropped(DropReason::ParkFull), places);
        }
        self.park(key, token, Needs::Lease, now_ns);
        self.settle(key, now_ns);
        (Admit::Parked, places)
    }

    /// Another packet of flow `key` that [`Replica::admit`] just answered `Process` for, at
    /// the same `now_ns`, nothing of its flow having changed since: processed as well.
    /// What `admit` would answer, without looking the flow up again (a burst's packets of
    /// one flow, read-centric programs' common case).
    pub fn admitted_again(&mut self) {
        self.counters.processed += 1;
    }

    /// A packet arrived that names its flow only by `alias` (this side knows no flow by
    /// it): held while the store is asked which flow that is; [`Event::Resolved`] names
    /// it then, or [`Event::Drop`] if the store does not answer within the park timeout.
    ///
    /// Packets so named hold at most a quarter of the park bound: packets to an address
    /// no flow has (a flood of spoofed answers) are dropped past it, and never crowd out
    /// the packets of flows known here.
    pub fn admit_alias(&mut self, now_ns: u64, alias: K, token: Token) -> Admit {
        let by_alias = self.parked_by_alias;
        if self.parked >= self.config.park_limit || by_alias >= self.config.park_limit / 4 {
            self.counters.dropped_park_full += 1;
            return Admit::Dropped(DropReason::ParkFull);
        }
        let resolving = self.resolving.entry(alias).or_insert_with(|| {
            self.to_resolve.push(alias);
            Resolving {
                nonce: 0,
                first_sent_ns: None,
                sent_ns: now_ns,
                tries: 0,
                parked: VecDeque::new(),
                covered: 0,
                armed_ns: None,
            }
        });
        resolving.parked.push_back((token, now_ns));
        self.parked += 1;
        self.parked_by_alias += 1;
        self.counters.parked_now = self.parked as u64;
        self.counters.parked_peak = self.counters.parked_peak.max(self.parked as u64);
        Admit::Parked
    }

    /// Names the flow's alias: its writes from now on carry it, and the store resolves it
    /// to the flow. Nothing if the flow is not known here.
    pub fn name_alias(&mut self, key: K, alias: K) {
        if let Some(flow) = self.flows.get_mut(&key)
            && flow.alias != Some(alias)
        {
            if let Some(old) = flow.alias.replace(alias) {
                self.aliases.remove(&old);
            }
            self.aliases.insert(alias, key);
        }
    }

    /// The flow known here by `alias` (named by a write, or by the store): a packet named
    /// by it is admitted by that flow's key.
    pub fn flow_of_alias(&self, alias: &K) -> Option<K> {
        self.aliases.get(alias).copied()
    }

    /// A packet admitted (or named by [`Event::Process`]) was processed; `change` is the
    /// flow's state after it when the packet changed it, and `lives_until_ns` when that
    /// state times out here unless another packet comes (this side's clock; `u64::MAX`:
    /// never): what the flow's writes and renewals tell the store, so that a state this
    /// side lets expire is not granted back.
    pub fn processed(
        &mut self,
        now_ns: u64,
        key: K,
        token: Token,
        change: Option<V>,
        lives_until_ns: u64,
    ) -> Release {
        self.processed_as(now_ns, key, token, |_| change, None, lives_until_ns)
    }

    /// As [`Replica::processed`], given the flow's whole state after the packet (`V`'s
    /// default: none): a change where it differs from the latest this side knows (a write
    /// waiting or on its way, else the store's), so that a worker reads a flow's state
    /// once, after the program, rather than before and after it. Whether it was a change.
    /// `places`: as [`Replica::admit_placed`] gave them (any will do), the program's
    /// place for the state where the worker found it now, handed back at the flow's next
    /// admission.
    pub fn processed_with_state<Q>(
        &mut self,
        now_ns: u64,
        key: K,
        token: Token,
        state: &Q,
        places: Places,
        lives_until_ns: u64,
    ) -> (Release, bool)
    where
        V: std::borrow::Borrow<Q>,
        Q: PartialEq + ToOwned<Owned = V> + ?Sized,
    {
        let mut changed = false;
        let release = self.processed_as(
            now_ns,
            key,
            token,
            |latest| {
                changed = latest.is_none_or(|v| v.borrow() != state);
                changed.then(|| state.to_owned())
            },
            Some(places),
            lives_until_ns,
        );
        (release, changed)
    }

    /// As [`Replica::processed`] with no change, for another packet of a flow whose state
    /// after it was just given to [`Replica::processed_with_state`] (a burst's later
    /// packets of one flow), found by `places` as that call was.
    pub fn processed_again(
        &mut self,
        now_ns: u64,
        key: K,
        token: Token,
        places: Places,
        lives_until_ns: u64,
    ) -> Release {
        self.processed_as(now_ns, key, token, |_| None, Some(places), lives_until_ns)
    }

    /// The program holds `state` for flow `key` where the store has another (it could
    /// not take the one its lease came with): what later states are compared with, so
    /// that the store's is written over only once the program's changes.
    pub fn program_holds(&mut self, key: &K, state: V) {
        if let Some(flow) = self.flows.get_mut(key) {
            flow.known = Some(state);
        }
    }

    fn processed_as(
        &mut self,
        now_ns: u64,
        key: K,
        token: Token,
        change: impl FnOnce(Option<&V>) -> Option<V>,
        places: Option<Places>,
        lives_until_ns: u64,
    ) -> Release {
        let flow = match places {
            Some(places) => self.flows.get_mut_at(places.flow, &key),
            // No place given: one found (the flow's steady mark keeps it).
            None => self.flows.get_mut_at(u32::MAX, &key),
        };
        let Some((flow, place)) = flow else {
            // Never admitted: nothing of it is known here, so nothing of it can be released.
            return Release::Dropped(DropReason::Fenced);
        };
        let hint_before = flow.hint;
        if let Some(places) = places {
            flow.hint = places.state;
        }
        // In use (admitted by its steady mark, the flow was not looked at then).
        flow.used_ns = flow.used_ns.max(now_ns);
        let change = change(flow.latest());
        flow.lives_until_ns = lives_until_ns;
        // A flow's packets are processed in order, so those named by `Event::Process` come
        // back before any admitted after them.
        flow.processing = flow.processing.saturating_sub(1);
        if let Some(value) = change {
            if flow.pending.replace(value).is_some() {
                self.counters.coalesced += 1;
            }
            if !flow.queued && flow.in_flight.is_none() {
                flow.queued = true;
                self.sendable.push(key);
            }
        }
        let needs = flow.depends_on();
        if flow.parked.is_empty() && needs <= flow.acked {
            self.counters.released_at_once += 1;
            // Still steady (the common case): its mark stands, unless a place it keeps
            // moved (the program's for its state, or the flow's here).
            let moved = flow.hint != hint_before || places.is_some_and(|p| p.flow != place);
            match flow.steady_until(now_ns, self.config.lease_ns) {
                Some(_) if flow.marked && !moved => {}
                Some(until_ns) => {
                    flow.marked = true;
                    let hint = flow.hint;
                    self.flows.mark_steady(key, place, until_ns, hint);
                }
                None if flow.marked => {
                    flow.marked = false;
                    self.flows.restate_steady(key, place, None);
                }
                None => {}
            }
            return Release::Now;
        }
        // Its output waits for a write: not steady.
        if flow.marked {
            flow.marked = false;
            self.flows.restate_steady(key, place, None);
        }
        if self.parked >= self.config.park_limit {
            self.counters.dropped_park_full += 1;
            return Release::Dropped(DropReason::ParkFull);
        }
        self.park(key, token, Needs::Seq(needs), now_ns);
        Release::Parked
    }

    /// The requests due now: the flows' waiting changes as one write each (those with no
    /// write on its way), leases to ask for or renew, and requests sent again.
    pub fn poll_transmit(&mut self, now_ns: u64, out: &mut Vec<Request<K, V>>) {
        let before = self.counters.acquires + self.counters.writes + self.counters.renewals;
        out.append(&mut self.outbox);
        for alias in std::mem::take(&mut self.to_resolve) {
            let Some(r) = self.resolving.get_mut(&alias) else {
                continue;
            };
            self.nonce += 1;
            (r.nonce, r.first_sent_ns, r.sent_ns) = (self.nonce, Some(now_ns), now_ns);
            r.covered = r.parked.len();
            out.push(Request::Resolve {
                alias,
                nonce: r.nonce,
            });
            self.counters.resolves += 1;
            self.arm_alias(alias, now_ns);
        }
        // Asks held back go first, as far as there is room, then what came since.
        while self.unanswered < self.config.asks_from
            && let Some(key) = self.asks_waiting.pop_front()
        {
            self.transmit(key, now_ns, out, true);
        }
        for key in std::mem::take(&mut self.sendable) {
            self.transmit(key, now_ns, out, false);
        }
        let after = self.counters.acquires + self.counters.writes + self.counters.renewals;
        if after > before && self.sent_unanswered.back() != Some(&now_ns) {
            self.sent_unanswered.push_back(now_ns);
            // Sendings a quarter lease old or older all make the reach its cap: the latest
            // of them stands for them all, so that a store silent for long (gone, or a link
            // losing everything) leaves a quarter lease's sendings here at most.
            let old = now_ns.saturating_sub(self.config.lease_ns / 4);
            while (self.sent_unanswered.get(1)).is_some_and(|&t| t <= old) {
                self.sent_unanswered.pop_front();
            }
        }
    }

    /// The flow's request due now, if any: its ask, its next write, or its renewal.
    /// `waited`: the flow comes from `asks_waiting`.
    fn transmit(&mut self, key: K, now_ns: u64, out: &mut Vec<Request<K, V>>, waited: bool) {
        let (lease_ns, asks_from) = (self.config.lease_ns, self.config.asks_from);
        let room = self.unanswered < asks_from && (waited || self.asks_waiting.is_empty());
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        let unanswered = flow.unanswered();
        if let Lease::Acquiring {
            first_sent_ns: first @ None,
            sent_ns,
            nonce,
            ..
        } = &mut flow.lease
        {
            if !room {
                // Still queued: it waits its turn.
                self.asks_waiting.push_back(key);
                return;
            }
            if flow.parked.is_empty() && !flow.retaking {
                // Its packets were dropped (held past the timeout) while it waited: none
                // needs the lease now, and the flow is forgotten. (A fenced write still
                // asks: the state its packets made is written however long they waited.)
                flow.lease = Lease::None;
                flow.queued = false;
                self.arm(key, now_ns);
                return;
            }
            *first = Some(now_ns);
            *sent_ns = now_ns;
            self.nonce += 1;
            *nonce = self.nonce;
            out.push(Request::Acquire {
                key,
                lease_ns,
                nonce: *nonce,
            });
            self.counters.acquires += 1;
        }
        flow.queued = false;
        if let Lease::Held { epoch, until_ns } = flow.lease {
            if flow.in_flight.is_none()
                && let Some(value) = flow.pending.take()
            {
                let seq = flow.acked + 1;
                out.push(Request::Write {
                    key,
                    epoch,
                    seq,
                    value: value.clone(),
                    lease_ns,
                    keep_ns: flow.keep_ns(now_ns, lease_ns),
                    alias: flow.alias,
                });
                flow.in_flight = Some(InFlight {
                    seq,
                    value,
                    first_sent_ns: now_ns,
                    sent_ns: now_ns,
                    tries: 0,
                });
                self.counters.writes += 1;
            } else if flow.idle() && renewal_due(now_ns, until_ns, lease_ns) {
                self.nonce += 1;
                out.push(Request::Renew {
                    key,
                    epoch,
                    lease_ns,
                    nonce: self.nonce,
                    keep_ns: flow.keep_ns(now_ns, lease_ns),
                    alias: flow.alias,
                });
                flow.renewing = Some(Renewing {
                    nonce: self.nonce,
                    first_sent_ns: now_ns,
                    sent_ns: now_ns,
                    tries: 0,
                });
                self.counters.renewals += 1;
            }
        }
        self.unanswered += flow.unanswered() - unanswered;
        self.arm(key, now_ns);
    }

    /// An answer from the store.
    pub fn handle_reply(&mut self, now_ns: u64, reply: Reply<K, V>) {
        // Any answer, even to a request answered before, shows the store is answering.
        let answered = &mut self.round_trips.answered_ns;
        *answered = (*answered).max(now_ns);
        // An alias has no flow of its own here: its packets wait apart.
        if let Reply::Resolved { alias, flow, nonce } = reply {
            self.resolved(now_ns, alias, flow, nonce);
            return;
        }
        let key = reply.key();
        let margin = self.config.margin_ns;
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        let unanswered = flow.unanswered();
        let until = |first_sent_ns: u64, lease_ns: u64| {
            lease_end(first_sent_ns, lease_ns, self.config.lease_ns, margin)
        };
        let mut fenced = false;
        match reply {
            Reply::Granted {
                epoch,
                seq,
                value,
                lease_ns,
                nonce,
                written_epoch,
                ..
            } => {
                let Lease::Acquiring {
                    first_sent_ns: Some(first),
                    waited,
                    nonce: asked,
                    ..
                } = flow.lease
                else {
                    return; // an answer sent again, to an ask already answered
                };
                if nonce != asked {
                    return; // to an earlier ask: its lease may have started before this one
                }
                self.round_trips.answered(now_ns, first);
                flow.lease = Lease::Held {
                    epoch,
                    until_ns: until(first, lease_ns),
                };
                self.counters.waited += u64::from(waited);
                let retaking = std::mem::take(&mut flow.retaking);
                let refused = flow.refused.take().map(|r| *r);
                // Only this side wrote under its own lease: a write of the refused one's
                // number under another's (even of the same state) is not this side's.
                let applied =
                    (refused.as_ref()).is_some_and(|(w, e)| seq == w.seq && written_epoch == *e);
                if retaking && (seq == flow.acked || applied) {
                    // Nothing written since this side's last: its changes go on under this
                    // lease, the outputs waiting for them still waiting.
                    flow.epoch = epoch;
                    self.counters.retaken += 1;
                    match refused {
                        Some((w, _)) if applied => (flow.acked, flow.known) = (seq, Some(w.value)),
                        // Written again: the latest state, with the changes since if any,
                        // in one write that every output waits for.
                        Some((w, _)) if flow.pending.is_none() => flow.pending = Some(w.value),
                        Some(_) => {
                            let next = flow.acked + 1;
                            for p in &mut flow.parked {
                                if let Needs::Seq(seq) = &mut p.needs {
                                    *seq = next;
                                }
                            }
                        }
                        None => {}
                    }
                    if flow.pending.is_some() && !flow.queued {
                        flow.queued = true;
                        self.sendable.push(key);
                    }
                } else {
                    if retaking {
                        // Another write came first: the fenced one is never to be applied.
                        flow.pending = None;
                        let dropped = drop_outputs_waiting_for_writes(flow, &mut self.events);
                        self.parked -= dropped;
                        self.counters.dropped_fenced += dropped as u64;
                    }
                    flow.acked = seq;
                    // The same epoch again: this side's own lease, asked for again near its
                    // end.
                    let renewed = flow.epoch == epoch;
                    flow.epoch = epoch;
                    self.counters.migrated += u64::from(value.is_some() && !renewed);
                    flow.known = Some(value.clone().unwrap_or_default());
                    self.events.push_back(Event::Install { key, value, waited });
                }
            }
            Reply::Held {
                remaining_ns,
                nonce,
                ..
            } => {
                let Lease::Acquiring {
                    first_sent_ns: Some(_),
                    nonce: asked,
                    ..
                } = flow.lease
                else {
                    return;
                };
                if nonce != asked {
                    return;
                }
                flow.lease = Lease::Waiting {
                    retry_ns: now_ns.saturating_add(remaining_ns.min(self.config.lease_ns)),
                };
            }
            Reply::Written {
                epoch,
                seq,
                lease_ns,
                ..
            } => {
                let Some(w) = flow.in_flight.as_ref().filter(|w| w.seq == seq) else {
                    return;
                };
                self.round_trips.answered(now_ns, w.first_sent_ns);
                let Lease::Held { epoch: e, until_ns } = &mut flow.lease else {
                    return;
                };
                if *e != epoch {
                    return;
                }
                *until_ns = (*until_ns).max(until(w.first_sent_ns, lease_ns));
                flow.acked = seq;
                flow.known = flow.in_flight.take().map(|w| w.value);
                if flow.pending.is_some() && !flow.queued {
                    flow.queued = true;
                    self.sendable.push(key);
                }
            }
            Reply::Renewed {
                epoch,
                lease_ns,
                nonce,
                ..
            } => {
                let Some(r) = flow.renewing.filter(|r| r.nonce == nonce) else {
                    return;
                };
                self.round_trips.answered(now_ns, r.first_sent_ns);
                if let Lease::Held { epoch: e, until_ns } = &mut flow.lease
                    && *e == epoch
                {
                    *until_ns = (*until_ns).max(until(r.first_sent_ns, lease_ns));
                    flow.renewing = None;
                }
            }
            Reply::Fenced { epoch, .. } => {
                let Lease::Held { epoch: e, .. } = flow.lease else {
                    return;
                };
                if e != epoch {
                    return; // about an earlier lease of ours, already given up
                }
                self.counters.fenced += 1;
                fenced = true;
            }
            Reply::Resolved { .. } => return, // taken above
        }
        // An answer ends the request it answers; `Fenced` every one of the flow's (its
        // lease lost, nothing of it is on its way any more).
        self.unanswered -= unanswered - if fenced { 0 } else { flow.unanswered() };
        if fenced {
            self.lose_lease(key, now_ns);
        }
        let answered_sent = self.round_trips.answered_sent_ns;
        while (self.sent_unanswered.front()).is_some_and(|&t| t <= answered_sent) {
            self.sent_unanswered.pop_front();
        }
        if self.unanswered == 0 {
            self.sent_unanswered.clear();
        }
        self.settle(key, now_ns);
        self.arm(key, now_ns);
    }

    /// Tells the program flow `key` is steady, if it is (and the program is told of
    /// marks), with until when: marked as any flow marked steady is, so that any change
    /// to it takes the mark away.
    fn tell_if_steady(&mut self, key: K, now_ns: u64) -> Option<u64> {
        let lease_ns = self.config.lease_ns;
        let (flow, _) = self.flows.get_mut_at(u32::MAX, &key)?;
        let until_ns = flow.steady_until(now_ns, lease_ns)?;
        flow.marked = true;
        self.flows.tell_marked(key, until_ns);
        Some(until_ns)
    }

    /// The store named the flow of `alias`: its packets go to be admitted again, in order.
    fn resolved(&mut self, now_ns: u64, alias: K, flow: Option<K>, nonce: u64) {
        let Some(r) = self.resolving.get(&alias) else {
            return; // an answer sent again, to an ask already answered
        };
        let Some(first) = r.first_sent_ns.filter(|_| r.nonce == nonce) else {
            return; // to an earlier ask: the alias may name a flow since
        };
        self.round_trips.answered(now_ns, first);
        let answered = match self.resolving.get_mut(&alias) {
            // The packets that came after the ask left are asked for again.
            Some(r) if flow.is_none() && r.covered < r.parked.len() => {
                let answered: VecDeque<_> = r.parked.drain(..r.covered).collect();
                (r.covered, r.first_sent_ns, r.tries) = (0, None, 0);
                self.to_resolve.push(alias);
                answered
            }
            _ => match self.resolving.remove(&alias) {
                Some(r) => r.parked,
                None => return,
            },
        };
        self.counters.resolved += u64::from(flow.is_some());
        if let Some(key) = flow {
            // Known here from now on by its alias too (until it is forgotten).
            self.flows.get_or_insert_with(key, || Flow::new(now_ns));
            self.name_alias(key, alias);
            self.arm(key, now_ns);
        }
        self.parked -= answered.len();
        self.parked_by_alias -= answered.len();
        self.counters.parked_now = self.parked as u64;
        for (token, _) in answered {
            self.events
                .push_back(Event::Resolved { alias, token, flow });
        }
    }

    /// Whether the timer at `at` of `key` is the one armed for it (as a flow or as an alias
    /// being resolved); the others in the heap are stale.
    fn armed(&self, key: &K, at: u64) -> bool {
        self.flows.get(key).is_some_and(|f| f.armed_ns == Some(at))
            || self
                .resolving
                .get(key)
                .is_some_and(|r| r.armed_ns == Some(at))
    }

    /// The earliest time [`Replica::handle_timeout`] has work.
    pub fn poll_timeout(&mut self) -> Option<u64> {
        while let Some(&Reverse((at, key))) = self.timers.peek() {
            if self.armed(&key, at) {
                return Some(at);
            }
            self.timers.pop(); // stale
        }
        None
    }

    /// Sends again what is unanswered, asks again where another's lease has passed, drops
    /// packets held too long, and renews the leases of flows in use.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        while let Some(&Reverse((at, key))) = self.timers.peek() {
            if at > now_ns {
                break;
            }
            self.timers.pop();
            if let Some(r) = self.resolving.get_mut(&key)
                && r.armed_ns == Some(at)
            {
                r.armed_ns = None;
                self.resolve_due(key, now_ns);
                self.arm_alias(key, now_ns);
            }
            match self.flows.get_mut(&key) {
                Some(f) if f.armed_ns == Some(at) => f.armed_ns = None,
                _ => continue,
            }
            self.due(key, now_ns);
            self.settle(key, now_ns);
            self.forget_if_lapsed(key, now_ns);
            self.arm(key, now_ns);
        }
    }

    pub fn poll_event(&mut self) -> Option<Event<K, V>> {
        self.events.pop_front()
    }

    /// Flows known, and the packets held now.
    pub fn flows(&self) -> usize {
        self.flows.len()
    }

    pub fn parked(&self) -> usize {
        self.parked
    }

    /// Checks the replica's running counts against its flows, walking every flow: for
    /// tests and simulations.
    #[doc(hidden)]
    pub fn check_bookkeeping(&self) -> Result<(), String> {
        let unanswered: usize = self.flows.values().map(Flow::unanswered).sum();
        if unanswered != self.unanswered {
            return Err(format!(
                "{} requests counted unanswered, {unanswered} in its flows",
                self.unanswered
            ));
        }
        let parked: usize = (self.flows.values().map(|f| f.parked.len()))
            .chain(self.resolving.values().map(|r| r.parked.len()))
            .sum();
        if parked != self.parked {
            return Err(format!(
                "{} packets counted held, {parked} in its flows",
                self.parked
            ));
        }
        Ok(())
    }

    fn park(&mut self, key: K, token: Token, needs: Needs, now_ns: u64) {
        if let Some(flow) = self.flows.get_mut(&key) {
            let first = flow.parked.is_empty();
            flow.parked.push_back(Parked {
                token,
                needs,
                since_ns: now_ns,
            });
            self.parked += 1;
            self.counters.parked_now = self.parked as u64;
            self.counters.parked_peak = self.counters.parked_peak.max(self.parked as u64);
            if first {
                self.arm(key, now_ns);
            }
        }
    }

    /// Releases, processes or drops the flow's held packets, front first, as far as they
    /// may go; asks for the lease when packets wait for it and nothing is on its way.
    fn settle(&mut self, key: K, now_ns: u64) {
        let timeout = self.config.park_timeout_ns;
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        while let Some(front) = flow.parked.front().copied() {
            if now_ns.saturating_sub(front.since_ns) >= timeout {
                flow.parked.pop_front();
                self.parked -= 1;
                self.counters.dropped_timed_out += 1;
                self.events.push_back(Event::Drop {
                    token: front.token,
                    reason: DropReason::TimedOut,
                });
                continue;
            }
            match front.needs {
                Needs::Seq(seq) if seq <= flow.acked => {
                    flow.parked.pop_front();
                    self.parked -= 1;
                    self.counters.released_held += 1;
                    let epoch = match flow.lease {
                        Lease::Held { epoch, .. } => epoch,
                        _ => 0,
                    };
                    self.events.push_back(Event::Release {
                        token: front.token,
                        epoch,
                        seq,
                    });
                }
                Needs::Seq(_) => break,
                Needs::Lease => {
                    if flow.held_until(now_ns).is_some() {
                        // Every packet behind waits for the lease too: all go to be processed,
                        // in order, and come back through `processed`.
                        while let Some(p) = flow.parked.pop_front() {
                            self.parked -= 1;
                            flow.processing += 1;
                            self.counters.processed += 1;
                            self.events.push_back(Event::Process {
                                key,
                                token: p.token,
                            });
                        }
                    } else if flow.idle() && matches!(flow.lease, Lease::None | Lease::Held { .. })
                    {
                        // Ask only with nothing of ours on its way: the state granted is then
                        // all the flow's, ours included.
                        flow.ask(key, now_ns, false, &mut self.sendable);
                    }
                    break;
                }
            }
        }
        self.counters.parked_now = self.parked as u64;
    }

    /// An alias's timed work due at `now_ns`: its packets held past the park timeout are
    /// dropped (the alias forgotten once none is left), and its ask is sent again when
    /// overdue.
    fn resolve_due(&mut self, alias: K, now_ns: u64) {
        let (rto, timeout) = (self.retransmit_ns(), self.config.park_timeout_ns);
        let resend_at = self.resend_at(rto);
        let Some(r) = self.resolving.get_mut(&alias) else {
            return;
        };
        while let Some(&(token, since_ns)) = r.parked.front() {
            if now_ns.saturating_sub(since_ns) < timeout {
                break;
            }
            r.parked.pop_front();
            r.covered = r.covered.saturating_sub(1);
            self.parked -= 1;
            self.parked_by_alias -= 1;
            self.counters.dropped_timed_out += 1;
            self.events.push_back(Event::Drop {
                token,
                reason: DropReason::TimedOut,
            });
        }
        self.counters.parked_now = self.parked as u64;
        if r.parked.is_empty() {
            self.resolving.remove(&alias);
            return;
        }
        if r.first_sent_ns.is_some() && now_ns >= resend_at(r.sent_ns, r.tries) {
            r.sent_ns = now_ns;
            r.tries += 1;
            self.outbox.push(Request::Resolve {
                alias,
                nonce: r.nonce,
            });
            self.counters.retransmits += 1;
        }
    }

    /// Puts the alias's next deadline (its ask sent again, its first packet's timeout) in
    /// the timer heap.
    fn arm_alias(&mut self, alias: K, now_ns: u64) {
        let (rto, timeout) = (self.retransmit_ns(), self.config.park_timeout_ns);
        let resend_at = self.resend_at(rto);
        let Some(r) = self.resolving.get_mut(&alias) else {
            return;
        };
        let mut next = resend_at(r.sent_ns, r.tries);
        if let Some(&(_, since_ns)) = r.parked.front() {
            next = next.min(since_ns.saturating_add(timeout));
        }
        let next = next.max(now_ns + 1);
        if r.armed_ns.is_some_and(|a| a <= next) {
            return;
        }
        r.armed_ns = Some(next);
        self.timers.push(Reverse((next, alias)));
    }

    /// The flow's timed work due at `now_ns`.
    fn due(&mut self, key: K, now_ns: u64) {
        let (rto, lease_ns) = (self.retransmit_ns(), self.config.lease_ns);
        let horizon = now_ns.saturating_add(self.reach_ns(now_ns));
        let resend_at = self.resend_at(rto);
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        let keep_ns = flow.keep_ns(now_ns, lease_ns);
        if let Some(w) = &mut flow.in_flight
            && now_ns >= resend_at(w.sent_ns, w.tries)
            && let Lease::Held { epoch, .. } = flow.lease
        {
            w.sent_ns = now_ns;
            w.tries += 1;
            self.outbox.push(Request::Write {
                key,
                epoch,
                seq: w.seq,
                value: w.value.clone(),
                lease_ns,
                keep_ns,
                alias: flow.alias,
            });
            self.counters.retransmits += 1;
        }
        if let Some(r) = &mut flow.renewing
            && now_ns >= resend_at(r.sent_ns, r.tries)
            && let Lease::Held { epoch, .. } = flow.lease
        {
            r.sent_ns = now_ns;
            r.tries += 1;
            self.outbox.push(Request::Renew {
                key,
                epoch,
                lease_ns,
                nonce: r.nonce,
                keep_ns,
                alias: flow.alias,
            });
            self.counters.retransmits += 1;
        }
        // In use: a packet within the last quarter of a lease. Not the last half: a lease
        // is renewed at its halfway point, a margin less than half a lease after the
        // packet that asked for it, so a flow of one packet would be renewed once for
        // nothing (a store call as dear as its ask). A flow whose packets come further
        // apart renews by its packets ([`Replica::admit`]).
        let (idle, in_use) = (
            flow.idle(),
            flow.processing > 0 || flow.used_ns.saturating_add(lease_ns / 4) > now_ns,
        );
        match &mut flow.lease {
            Lease::Acquiring {
                first_sent_ns: Some(_),
                sent_ns,
                tries,
                nonce,
                ..
            } if now_ns >= resend_at(*sent_ns, *tries) => {
                *sent_ns = now_ns;
                *tries += 1;
                self.outbox.push(Request::Acquire {
                    key,
                    lease_ns,
                    nonce: *nonce,
                });
                self.counters.retransmits += 1;
            }
            Lease::Waiting { retry_ns } if now_ns >= *retry_ns => {
                flow.ask(key, now_ns, true, &mut self.sendable);
            }
            // Not a renewal that would reach the store after the lease (the timer came late:
            // a worker busy that long): it would be refused, and the flow forgotten.
            Lease::Held { until_ns, .. }
                if idle
                    && in_use
                    && *until_ns > horizon
                    && renewal_due(now_ns, *until_ns, lease_ns)
                    && !flow.queued =>
            {
                flow.queued = true;
                self.sendable.push(key);
            }
            _ => {}
        }
    }

    /// The lease is lost (fenced). With a write refused or a change unsent, the flow asks
    /// for the lease again, keeping its changes and the outputs waiting for them (see
    /// `retaking`): a store or link gone for longer than a lease loses nothing that way,
    /// while no other holder wrote meanwhile. Else the flow's state is forgotten here, and
    /// packets not yet processed wait for the lease again.
    fn lose_lease(&mut self, key: K, now_ns: u64) {
        let Some((flow, place)) = self.flows.get_mut_at(u32::MAX, &key) else {
            return;
        };
        flow.lease = Lease::None;
        flow.renewing = None;
        // Without the lease, the worker drops the packets it had to process.
        flow.processing = 0;
        let refused = flow.in_flight.take();
        if refused.is_some() || flow.pending.is_some() {
            flow.refused = refused.map(|w| Box::new((w, flow.epoch)));
            flow.retaking = true;
            let marked = std::mem::take(&mut flow.marked);
            flow.ask(key, now_ns, false, &mut self.sendable);
            if marked {
                self.flows.restate_steady(key, place, None);
            }
            return;
        }
        flow.known = None;
        let dropped = drop_outputs_waiting_for_writes(flow, &mut self.events);
        self.parked -= dropped;
        self.counters.dropped_fenced += dropped as u64;
        self.events.push_back(Event::Forget { key });
    }

    /// A flow with nothing held, nothing to send and no lease held any more is forgotten,
    /// here and (by [`Event::Forget`]) by the worker: the store's state is the flow's, and
    /// its next packet asks for it.
    fn forget_if_lapsed(&mut self, key: K, now_ns: u64) {
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        let lapsed = match flow.lease {
            Lease::None => true,
            Lease::Held { until_ns, .. } => now_ns >= until_ns,
            Lease::Acquiring { .. } | Lease::Waiting { .. } => false,
        };
        if lapsed {
            // Without the lease, the worker drops the packets it had to process.
            flow.processing = 0;
        }
        if lapsed && flow.idle() && flow.parked.is_empty() && !flow.queued {
            if let Some(alias) = flow.alias {
                self.aliases.remove(&alias);
            }
            self.flows.remove(&key);
            self.counters.flows = self.flows.len() as u64;
            self.events.push_back(Event::Forget { key });
        }
    }

    /// How long a request sent at `now_ns` takes to reach the store, at most: the
    /// measured round trip with four times its variation (as a retransmission timeout
    /// is), or longer while the oldest request unanswered has waited longer (a store, or
    /// a link, fallen behind: a request sent now queues behind it), and never less than
    /// an eighth of a lease nor more than a quarter. A packet is processed only if its
    /// flow's lease runs that much longer, since a write it makes reaches the store that
    /// much later, and one reaching it after the lease is fenced and its output dropped.
    /// A flow whose lease ends sooner asks for it again first (the holder asking keeps its
    /// epoch while the lease runs).
    ///
    /// The floor is for the store that stalls with no warning (a server descheduled for
    /// tens of milliseconds on a busy host, after round trips of one or two): a write sent
    /// with a few milliseconds of its lease left was fenced that way. Flows in use renew
    /// at half a lease and never come near it.
    fn reach_ns(&self, now_ns: u64) -> u64 {
        let (floor, cap) = (self.config.lease_ns / 8, self.config.lease_ns / 4);
        let behind = (self.sent_unanswered.front()).map_or(0, |&t| now_ns.saturating_sub(t));
        (self.round_trips.timeout(floor, cap)).max(behind.min(cap))
    }

    /// The wait before a request is first sent again: the configured one, or longer as
    /// the store's answers take longer, never past a quarter of a lease (so that a lost
    /// request is sent again well within the lease it is for).
    fn retransmit_ns(&self) -> u64 {
        let floor = self.config.retransmit_ns;
        (self.round_trips).timeout(floor, (self.config.lease_ns / 4).max(floor))
    }

    /// When a request last sent at a time, `tries` times already, is to be sent again.
    fn resend_at(&self, rto: u64) -> impl Fn(u64, u32) -> u64 + use<K, V> {
        let round_trips = self.round_trips;
        move |sent_ns, tries| round_trips.resend_at(sent_ns, backoff(rto, tries))
    }

    /// Puts the flow's next deadline in the timer heap, if earlier than the one there.
    /// Deadlines are after `now_ns`, so that a pass of [`Replica::handle_timeout`] ends.
    fn arm(&mut self, key: K, now_ns: u64) {
        let (rto, lease_ns, timeout) = (
            self.retransmit_ns(),
            self.config.lease_ns,
            self.config.park_timeout_ns,
        );
        let resend_at = self.resend_at(rto);
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        let mut next = u64::MAX;
        if let Some(w) = &flow.in_flight {
            next = next.min(resend_at(w.sent_ns, w.tries));
        }
        if let Some(r) = &flow.renewing {
            next = next.min(resend_at(r.sent_ns, r.tries));
        }
        match flow.lease {
            Lease::Acquiring {
                first_sent_ns: Some(_),
                sent_ns,
                tries,
                ..
            } => next = next.min(resend_at(sent_ns, tries)),
            Lease::Waiting { retry_ns } => next = next.min(retry_ns),
            Lease::Held { until_ns, .. } if flow.idle() => {
                // Renew halfway if the flow is in use then; forget it when the lease ends.
                let halfway = until_ns.saturating_sub(lease_ns / 2);
                next = next.min(if halfway > now_ns { halfway } else { until_ns });
            }
            Lease::None if flow.idle() && flow.parked.is_empty() => next = next.min(now_ns),
            _ => {}
        }
        if let Some(p) = flow.parked.front() {
            next = next.min(p.since_ns.saturating_add(timeout));
        }
        let next = next.max(now_ns + 1);
        if next == u64::MAX || flow.armed_ns.is_some_and(|a| a <= next) {
            return;
        }
        flow.armed_ns = Some(next);
        self.timers.push(Reverse((next, key)));
    }
}

/// The wait before a request sent `tries` times is sent again: `rto`, doubling with each
/// sending, up to 16 times it.
pub(crate) fn backoff(rto: u64, tries: u32) -> u64 {
    rto.saturating_mul(1 << tries.min(4))
}

/// Where a lease granted for `granted_ns` ends on the asker's clock: taken to start when
/// its request was first sent, never longer than asked (`asked_ns`), `margin_ns` early.
pub(crate) fn lease_end(first_sent_ns: u64, granted_ns: u64, asked_ns: u64, margin_ns: u64) -> u64 {
    first_sent_ns
        .saturating_add(granted_ns.min(asked_ns))
        .saturating_sub(margin_ns)
}

/// Drops the flow's packets at the front whose outputs wait for a write that will not be
/// applied (fenced): what they saw is not the store's. How many.
fn drop_outputs_waiting_for_writes<K, V>(
    flow: &mut Flow<K, V>,
    events: &mut VecDeque<Event<K, V>>,
) -> usize {
    let mut dropped = 0;
    while let Some(p) = flow.parked.front().copied() {
        if matches!(p.needs, Needs::Lease) {
            break;
        }
        flow.parked.pop_front();
        dropped += 1;
        events.push_back(Event::Drop {
            token: p.token,
            reason: DropReason::Fenced,
        });
    }
    dropped
}

/// A lease with half its time left, or less, is renewed.
fn renewal_due(now_ns: u64, until_ns: u64, lease_ns: u64) -> bool {
    until_ns.saturating_sub(now_ns) <= lease_ns / 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{StoreConfig, StoreCore};

    const MS: u64 = 1_000_000;
    const A: Holder = Holder {
        switch: 1,
        incarnation: 0,
    };

    fn config() -> ReplicaConfig {
        ReplicaConfig {
            lease_ns: 100 * MS,
            margin_ns: MS,
            retransmit_ns: 5 * MS,
            park_limit: 4,
            park_timeout_ns: 150 * MS,
            asks_from: 64,
        }
    }

    fn events(r: &mut Replica<u32, u64>) -> Vec<Event<u32, u64>> {
        std::iter::from_fn(|| r.poll_event()).collect()
    }

    /// The random runs' draws from `seed`: each call a number below its argument.
    fn draws(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut rng = seed;
        move |n: u64| {
            rng = rng
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (rng >> 33) % n
        }
    }

    /// A step of the random runs: the replica's requests go to the store, whose answers
    /// come back up to 2 ms late or are lost (one in eight); timers due fire; and the
    /// packets the answers let through are processed, showing their flow's `states`.
    fn lossy_store_step(
        r: &mut Replica<u32, u64>,
        s: &mut StoreCore<u32, u64>,
        now: u64,
        next: &mut impl FnMut(u64) -> u64,
        states: &[u64],
    ) {
        let mut out = Vec::new();
        r.poll_transmit(now, &mut out);
        for q in out {
            let reply = s.handle(now, r.holder(), q);
            if next(8) != 0 {
                r.handle_reply(now + next(2 * MS), reply);
            }
        }
        while let Some(t) = r.poll_timeout().filter(|&t| t <= now) {
            r.handle_timeout(t);
        }
        for e in events(r) {
            if let Event::Process { key, token } = e {
                let state = states[key as usize];
                r.processed_with_state(now, key, token, &state, Places::NONE, u64::MAX);
            }
        }
    }

    /// Sends what is due to the store and hands its answers back, at `now`.
    fn round_trip(r: &mut Replica<u32, u64>, s: &mut StoreCore<u32, u64>, now: u64) -> usize {
        let mut out = Vec::new();
        r.poll_transmit(now, &mut out);
        let n = out.len();
        for q in out {
            let a = s.handle(now, r.holder(), q);
            r.handle_reply(now, a);
        }
        n
    }

    /// Flow 7's first packet asks for the lease at 0, which the store takes at once and
    /// answers at `answered`; the packet is processed then and leaves at once.
    fn flow_7_granted(r: &mut Replica<u32, u64>, s: &mut StoreCore<u32, u64>, answered: u64) {
        assert_eq!(r.admit(0, 7, 1), Admit::Parked);
        let mut out = Vec::new();
        r.poll_transmit(0, &mut out);
        let granted = s.handle(0, A, out.remove(0));
        r.handle_reply(answered, granted);
        events(r);
        assert_eq!(r.processed(answered, 7, 1, None, u64::MAX), Release::Now);
    }

    /// Flow 7's packet `token`, arriving at `at` too near its lease's end, waits for the
    /// lease again: the ask reaches the store at `reached` and is answered at `answered`,
    /// when the packet is processed (writing 5); that write reaches the store at
    /// `written`, which takes it. The store's answer to the write.
    fn flow_7_asks_again_and_writes(
        r: &mut Replica<u32, u64>,
        s: &mut StoreCore<u32, u64>,
        token: Token,
        [at, reached, answered, written]: [u64; 4],
    ) -> Reply<u32, u64> {
        assert_eq!(r.admit(at, 7, token), Admit::Parked);
        let mut out = Vec::new();
        r.poll_transmit(at, &mut out);
        assert!(matches!(out[..], [Request::Acquire { .. }]), "{out:?}");
        let granted = s.handle(reached, A, out.remove(0));
        r.handle_reply(answered, granted);
        assert!(
            events(r).contains(&Event::Process { key: 7, token }),
            "processed under the new lease"
        );
        assert_eq!(
            r.processed(answered, 7, token, Some(5), u64::MAX),
            Release::Parked
        );
        r.poll_transmit(answered, &mut out);
        let reply = s.handle(written, A, out.remove(0));
        assert!(matches!(reply, Reply::Written { .. }), "{reply:?}");
        reply
    }

    /// Runs the timers due up to `to`, each time sending what is due to the store.
    /// The replica's side of a step at `now`: its timers, and the packets it lets
    /// through processed with no change. The leases it installed.
    fn work(r: &mut Replica<u32, u64>, now: u64) -> usize {
        while let Some(t) = r.poll_timeout().filter(|&t| t <= now) {
            r.handle_timeout(t);
        }
        let mut installed = 0;
        for e in events(r) {
            match e {
                Event::Install { .. } => installed += 1,
                Event::Process { key, token } => {
                    r.processed(now, key, token, None, u64::MAX);
                }
                _ => {}
            }
        }
        installed
    }

    fn advance(r: &mut Replica<u32, u64>, s: &mut StoreCore<u32, u64>, to: u64) {
        while let Some(t) = r.poll_timeout().filter(|&t| t <= to) {
            r.handle_timeout(t);
            round_trip(r, s, t);
        }
    }

    /// A lease granted late, with less of it left than a round trip, still lets the
    /// packets handed to the worker under it be processed, and the flow's next packet with
    /// them: the flow does not ask for its lease again under them (that would take the
    /// lease from packets already processed, which would be dropped as lapsed).
    #[test]
    fn packets_handed_to_the_worker_keep_the_lease_they_were_handed_under() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        assert_eq!(r.admit(0, 7, 1), Admit::Parked);
        let mut out = Vec::new();
        r.poll_transmit(0, &mut out);
        // The store grants at once; its answer comes 80 ms later, with 19 ms of the lease
        // left on this side's clock, less than the round trip it measured.
        for q in out {
            let a = s.handle(0, r.holder(), q);
            r.handle_reply(80 * MS, a);
        }
        let e = events(&mut r);
        assert!(
            matches!(
                &e[..],
                [Event::Install { .. }, Event::Process { token: 1, .. }]
            ),
            "{e:?}"
        );
        assert_eq!(
            r.admit(80 * MS, 7, 2),
            Admit::Process,
            "not asked for again"
        );
        assert!(r.holds(&7, 80 * MS));
        r.processed(80 * MS, 7, 1, Some(1), u64::MAX);
        r.processed(80 * MS, 7, 2, Some(2), u64::MAX);
        round_trip(&mut r, &mut s, 80 * MS);
        let released: Vec<Token> = (events(&mut r).into_iter())
            .filter_map(|e| match e {
                Event::Release { token, .. } => Some(token),
                _ => None,
            })
            .collect();
        assert_eq!(
            released,
            [1, 2],
            "both written under the lease and released"
        );
    }

    /// An answer of no flow to an alias's ask is only for the packets held when the ask
    /// left: one that came after may come after the store answered (the flow written with
    /// the alias meanwhile), so it waits for an ask of its own.
    #[test]
    fn an_alias_named_by_no_flow_is_asked_again_for_packets_that_came_after_the_ask() {
        let roomy = ReplicaConfig {
            park_limit: 16,
            ..config()
        };
        let mut r = Replica::new(A, roomy);
        let mut s = StoreCore::new(StoreConfig::default());
        assert_eq!(r.admit_alias(0, 1007, 10), Admit::Parked);
        let mut ask = Vec::new();
        r.poll_transmit(0, &mut ask);
        let none = s.handle(MS, A, ask.remove(0));
        assert!(
            matches!(none, Reply::Resolved { flow: None, .. }),
            "{none:?}"
        );
        // Flow 7 is written with the alias, and a packet by the alias comes, before the
        // answer of no flow does.
        let mut w = Replica::new(Holder { switch: 2, ..A }, config());
        w.admit(MS, 7, 1);
        round_trip(&mut w, &mut s, MS);
        events(&mut w);
        w.name_alias(7, 1007);
        w.processed(MS, 7, 1, Some(5), u64::MAX);
        round_trip(&mut w, &mut s, MS);
        assert_eq!(r.admit_alias(2 * MS, 1007, 11), Admit::Parked);
        r.handle_reply(2 * MS, none);
        assert_eq!(
            events(&mut r),
            [Event::Resolved {
                alias: 1007,
                token: 10,
                flow: None
            }]
        );
        assert_eq!(r.parked(), 1);
        // Asked again, the store names flow 7 for it.
        assert_eq!(round_trip(&mut r, &mut s, 2 * MS), 1);
        assert_eq!(
            events(&mut r),
            [Event::Resolved {
                alias: 1007,
                token: 11,
                flow: Some(7)
            }]
        );
        assert_eq!((r.parked(), r.counters.resolves), (0, 2));
        assert_eq!(r.check_bookkeeping(), Ok(()));
    }

    #[test]
    fn a_packet_known_only_by_an_alias_waits_for_the_store_to_name_its_flow() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        // Flow 7 is written with its alias 1007.
        r.admit(0, 7, 1);
        round_trip(&mut r, &mut s, 0);
        events(&mut r);
        r.name_alias(7, 1007);
        r.processed(0, 7, 1, Some(5), u64::MAX);
        round_trip(&mut r, &mut s, 0);
        assert!(matches!(
            &events(&mut r)[..],
            [Event::Release { token: 1, .. }]
        ));
        // Another switch knows neither: packets by the alias (one ask for both) and by an
        // alias nobody wrote.
        let roomy = ReplicaConfig {
            park_limit: 16,
            ..config()
        };
        let mut b = Replica::new(Holder { switch: 2, ..A }, roomy);
        assert_eq!(b.admit_alias(MS, 1007, 10), Admit::Parked);
        assert_eq!(b.admit_alias(MS, 1007, 11), Admit::Parked);
        assert_eq!(b.admit_alias(MS, 2000, 12), Admit::Parked);
        assert_eq!(b.parked(), 3);
        assert_eq!(round_trip(&mut b, &mut s, MS), 2, "one ask an alias");
        assert_eq!(
            events(&mut b),
            [
                Event::Resolved {
                    alias: 1007,
                    token: 10,
                    flow: Some(7)
                },
                Event::Resolved {
                    alias: 1007,
                    token: 11,
                    flow: Some(7)
                },
                Event::Resolved {
                    alias: 2000,
                    token: 12,
                    flow: None
                },
            ]
        );
        assert_eq!(
            (b.parked(), b.counters.resolves, b.counters.resolved),
            (0, 2, 1)
        );
        // Known by its alias from now on: the next packet so named asks nothing.
        assert_eq!(
            (b.flow_of_alias(&1007), b.flow_of_alias(&2000)),
            (Some(7), None)
        );
        // Admitted again by the flow's key, they wait for its lease and get its state.
        assert_eq!(b.admit(MS, 7, 10), Admit::Parked);
        round_trip(&mut b, &mut s, MS);
        advance(&mut b, &mut s, 140 * MS);
        let seen = events(&mut b);
        assert!(
            seen.contains(&Event::Install {
                key: 7,
                value: Some(5),
                waited: true
            }),
            "{seen:?}"
        );
        // Forgotten with its flow, once its lease has passed unused.
        assert_eq!(b.processed(140 * MS, 7, 10, None, u64::MAX), Release::Now);
        advance(&mut b, &mut s, 2_000 * MS);
        assert_eq!((b.flows(), b.flow_of_alias(&1007)), (0, None));
    }

    #[test]
    fn an_alias_ask_unanswered_is_sent_again_and_its_packets_dropped_at_the_park_timeout() {
        let mut r: Replica<u32, u64> = Replica::new(A, config());
        r.admit_alias(0, 1007, 1);
        let mut out = Vec::new();
        r.poll_transmit(0, &mut out);
        assert_eq!(
            out,
            [Request::Resolve {
                alias: 1007,
                nonce: 1
            }]
        );
        // Lost: sent again, the same ask, as the retransmission timer says.
        let mut sent = 1;
        while let Some(t) = r.poll_timeout().filter(|&t| t < 150 * MS) {
            r.handle_timeout(t);
            out.clear();
            r.poll_transmit(t, &mut out);
            assert!(out.iter().all(|q| *q
                == Request::Resolve {
                    alias: 1007,
                    nonce: 1
                }));
            sent += out.len();
        }
        assert!(sent >= 3, "sent {sent} times");
        assert!(events(&mut r).is_empty());
        let t = r.poll_timeout().expect("the park timeout");
        r.handle_timeout(t);
        assert_eq!(
            events(&mut r),
            [Event::Drop {
                token: 1,
                reason: DropReason::TimedOut
            }]
        );
        assert_eq!((r.parked(), r.poll_timeout()), (0, None), "forgotten");
        // A late answer to the forgotten ask names nothing.
        r.handle_reply(
            t,
            Reply::Resolved {
                alias: 1007,
                flow: Some(7),
                nonce: 1,
            },
        );
        assert!(events(&mut r).is_empty());
        // Nor does an answer to an earlier ask, once another is on its way.
        r.admit_alias(t, 1007, 2);
        r.poll_transmit(t, &mut out);
        r.handle_reply(
            t,
            Reply::Resolved {
                alias: 1007,
                flow: None,
                nonce: 1,
            },
        );
        assert!(events(&mut r).is_empty());
        assert_eq!(r.parked(), 1);
    }

    #[test]
    fn packets_known_by_an_alias_hold_a_quarter_of_the_park_at_most() {
        let mut r: Replica<u32, u64> = Replica::new(
            A,
            ReplicaConfig {
                park_limit: 8,
                ..config()
            },
        );
        // A flood of packets to aliases no flow has: two held, the rest dropped.
        for token in 0..2 {
            assert_eq!(r.admit_alias(0, 1000 + token as u32, token), Admit::Parked);
        }
        for token in 2..10 {
            assert_eq!(
                r.admit_alias(0, 1000 + token as u32, token),
                Admit::Dropped(DropReason::ParkFull)
            );
        }
        // The packets of flows known here still have their room.
        for token in 10..16 {
            assert_eq!(r.admit(0, 7, token), Admit::Parked);
        }
        assert_eq!(r.admit(0, 7, 16), Admit::Dropped(DropReason::ParkFull));
        // Answered, the alias packets leave the park and make room for others.
        let mut out = Vec::new();
        r.poll_transmit(0, &mut out);
        for q in out {
            if let Request::Resolve { alias, nonce } = q {
                r.handle_reply(
                    0,
                    Reply::Resolved {
                        alias,
                        flow: None,
                        nonce,
                    },
                );
            }
        }
        assert_eq!(events(&mut r).len(), 2);
        assert_eq!(r.admit_alias(0, 2000, 17), Admit::Parked);
    }

    #[test]
    fn a_new_flow_waits_for_its_lease_then_writes_hold_outputs_until_acknowledged() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        assert_eq!(r.admit(0, 7, 1), Admit::Parked);
        assert_eq!(r.admit(0, 7, 2), Admit::Parked, "behind the first");
        assert_eq!(round_trip(&mut r, &mut s, 0), 1, "one ask for the lease");
        assert_eq!(
            events(&mut r),
            [
                Event::Install {
                    key: 7,
                    value: None,
                    waited: false
                },
                Event::Process { key: 7, token: 1 },
                Event::Process { key: 7, token: 2 },
            ]
        );
        // Both change the flow in one burst: one write carries the last state.
        assert_eq!(r.processed(0, 7, 1, Some(1), u64::MAX), Release::Parked);
        assert_eq!(r.processed(0, 7, 2, Some(2), u64::MAX), Release::Parked);
        assert_eq!(r.counters.coalesced, 1);
        // A read while the write is on its way waits behind it.
        assert_eq!(r.admit(0, 7, 3), Admit::Process);
        assert_eq!(r.processed(0, 7, 3, None, u64::MAX), Release::Parked);
        let mut out = Vec::new();
        r.poll_transmit(0, &mut out);
        assert_eq!(
            out,
            [Request::Write {
                key: 7,
                epoch: 1,
                seq: 1,
                value: 2,
                lease_ns: 100 * MS,
                keep_ns: KEEP_FOREVER,
                alias: None,
            }]
        );
        assert!(
            events(&mut r).is_empty(),
            "nothing leaves before the store has it"
        );
        let a = s.handle(1, A, out.remove(0));
        r.handle_reply(1, a);
        assert_eq!(
            events(&mut r),
            [1, 2, 3].map(|token| Event::Release {
                token,
                epoch: 1,
                seq: 1
            })
        );
        assert_eq!(s.record(&7).and_then(|r| r.value), Some(2));
        // With nothing on its way, reads leave at once.
        assert_eq!(r.admit(2, 7, 4), Admit::Process);
        assert_eq!(r.processed(2, 7, 4, None, u64::MAX), Release::Now);
    }

    /// Given the flow's whole state after each packet, the replica writes it only where it
    /// differs from the latest it knows: the installed state, a write waiting or on its
    /// way, the last one acknowledged; or what the program held where it could not take
    /// the installed state.
    #[test]
    fn a_state_given_whole_is_written_only_where_it_differs_from_the_latest_known() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        let process = |r: &mut Replica<u32, u64>, token, state: u64| {
            assert_eq!(r.admit(0, 7, token), Admit::Process);
            r.processed_with_state(0, 7, token, &state, Places::NONE, u64::MAX)
        };
        r.admit(0, 7, 1);
        round_trip(&mut r, &mut s, 0);
        events(&mut r);
        // Installed with no state: the default (none) is no change; 5 is.
        assert_eq!(
            r.processed_with_state(0, 7, 1, &0, Places::NONE, u64::MAX),
            (Release::Now, false)
        );
        assert_eq!(process(&mut r, 2, 5), (Release::Parked, true));
        // 5 again, while its write waits: no second write, the output behind it.
        assert_eq!(process(&mut r, 3, 5), (Release::Parked, false));
        assert_eq!(round_trip(&mut r, &mut s, 0), 1, "one write");
        assert_eq!(s.record(&7).and_then(|r| r.value), Some(5));
        events(&mut r);
        // Acknowledged: 5 is the store's, and reads leave at once.
        assert_eq!(process(&mut r, 4, 5), (Release::Now, false));
        assert_eq!(round_trip(&mut r, &mut s, 0), 0, "nothing to write");
        // The program could not take the store's state and holds 0: 0 is no change (the
        // store keeps 5), 6 is.
        r.program_holds(&7, 0);
        assert_eq!(process(&mut r, 5, 0), (Release::Now, false));
        assert_eq!(process(&mut r, 6, 6), (Release::Parked, true));
        round_trip(&mut r, &mut s, 0);
        assert_eq!(s.record(&7).and_then(|r| r.value), Some(6));
    }

    #[test]
    fn unanswered_writes_are_sent_again_with_the_same_sequence_number() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        r.admit(0, 7, 1);
        round_trip(&mut r, &mut s, 0);
        events(&mut r);
        r.processed(0, 7, 1, Some(5), u64::MAX);
        let mut lost = Vec::new();
        r.poll_transmit(0, &mut lost);
        assert_eq!(r.poll_timeout(), Some(5 * MS));
        r.handle_timeout(5 * MS);
        let mut again = Vec::new();
        r.poll_transmit(5 * MS, &mut again);
        assert_eq!(again, lost, "the same write");
        // Both arrive: the second is answered again, applied once.
        for q in lost.into_iter().chain(again) {
            let a = s.handle(6 * MS, A, q);
            r.handle_reply(6 * MS, a);
        }
        assert_eq!(
            events(&mut r),
            [Event::Release {
                token: 1,
                epoch: 1,
                seq: 1
            }]
        );
        assert_eq!((s.counters.written, s.counters.repeated), (1, 1));
        assert_eq!(r.counters.retransmits, 1);
    }

    /// A store that answers every request 40 ms after it, far past the 5 ms retransmit
    /// setting: requests wait for it rather than go again (each would only add to a busy
    /// store's work), the first ones for a quarter of a lease, the others as its answers
    /// show how long it takes; 100 flows, each a lease and a write.
    #[test]
    fn a_slow_store_is_waited_for_once_its_answers_show_how_slow() {
        let slow = 40 * MS;
        let mut r = Replica::new(
            A,
            ReplicaConfig {
                lease_ns: 1_000 * MS,
                park_limit: 1_000,
                park_timeout_ns: 2_000 * MS,
                ..config()
            },
        );
        let mut s = StoreCore::new(StoreConfig::default());
        // Answers on their way back, by arrival time.
        let mut answers: Vec<(u64, Reply<u32, u64>)> = Vec::new();
        let mut sent = 0;
        // A new flow every 10 ms, then time for the last ones' answers.
        for now in (0..1_100 * MS).step_by(MS as usize) {
            let key = (now / (10 * MS)) as u32;
            if key < 100 && now % (10 * MS) == 0 {
                r.admit(now, key, u64::from(key));
            }
            for (_, a) in answers.extract_if(.., |(at, _)| *at <= now) {
                r.handle_reply(now, a);
            }
            while let Some(t) = r.poll_timeout().filter(|&t| t <= now) {
                r.handle_timeout(t);
            }
            for e in events(&mut r) {
                if let Event::Process { key, token } = e {
                    r.processed(now, key, token, Some(u64::from(key)), u64::MAX);
                }
            }
            let mut out = Vec::new();
            r.poll_transmit(now, &mut out);
            sent += out.len();
            for q in out {
                answers.push((now + slow, s.handle(now, A, q)));
            }
        }
        assert_eq!(
            s.counters.written, 100,
            "every flow's write reached the store"
        );
        let retransmits = r.counters.retransmits;
        assert!(retransmits == 0, "{retransmits} sent again of {sent}");
    }

    /// A store falling ever further behind but answering in order (as Redis does over one
    /// connection) is waited for, however late its answers: a request is sent again only
    /// once a request sent after it has been answered, or once the store has said nothing
    /// for the request's timeout.
    #[test]
    fn a_request_is_sent_again_on_evidence_of_its_loss_never_for_lateness_alone() {
        let mut r = Replica::new(
            A,
            ReplicaConfig {
                park_limit: 1_000,
                ..config()
            },
        );
        let mut s = StoreCore::new(StoreConfig::default());
        let mut queue: VecDeque<Request<u32, u64>> = VecDeque::new();
        let mut next_answer = 0;
        let mut installed = 0;
        // A new flow every 2 ms for 60 ms, the store answering one request every 3 ms:
        // the last ask waits some 30 ms, six times the timeout's 5 ms floor.
        for now in (0..200 * MS).step_by(MS as usize) {
            if now < 60 * MS && now % (2 * MS) == 0 {
                let key = (now / (2 * MS)) as u32;
                r.admit(now, key, u64::from(key));
            }
            if now >= next_answer
                && let Some(q) = queue.pop_front()
            {
                let a = s.handle(now, A, q);
                r.handle_reply(now, a);
                next_answer = now + 3 * MS;
            }
            installed += work(&mut r, now);
            let mut out = Vec::new();
            r.poll_transmit(now, &mut out);
            queue.extend(out);
        }
        assert_eq!(installed, 30, "every flow's lease granted");
        assert_eq!(r.counters.retransmits, 0);
        assert_eq!(r.check_bookkeeping(), Ok(()));

        // Afresh, a round trip of 1 ms measured: the timeout is its floor, 5 ms. Two asks
        // 1 ms apart; the first is lost, the second answered at once.
        let mut r = Replica::new(A, config());
        r.admit(0, 9, 9);
        let mut out = Vec::new();
        r.poll_transmit(0, &mut out);
        let a = s.handle(MS, A, out.remove(0));
        r.handle_reply(MS, a);
        let mut lost = Vec::new();
        r.admit(10 * MS, 100, 100);
        r.poll_transmit(10 * MS, &mut lost);
        r.admit(11 * MS, 101, 101);
        r.poll_transmit(11 * MS, &mut out);
        let a = s.handle(11 * MS, A, out.remove(0));
        r.handle_reply(11 * MS, a);
        // Sent again at its timeout from its sending.
        assert_eq!(r.poll_timeout(), Some(15 * MS));
        r.handle_timeout(15 * MS);
        let mut again = Vec::new();
        r.poll_transmit(15 * MS, &mut again);
        assert_eq!(again, lost, "the lost ask, again");
        assert_eq!(r.counters.retransmits, 1);

        // An ask the store says nothing to (flow 102's, at 20 ms), while it answers one
        // sent before it (flow 103's, sent at 18 ms, answered at 22 ms): sent again once
        // the store has been silent its timeout since that answer.
        for a in again.into_iter().map(|q| s.handle(16 * MS, A, q)) {
            r.handle_reply(16 * MS, a);
        }
        let mut earlier = Vec::new();
        r.admit(18 * MS, 103, 103);
        r.poll_transmit(18 * MS, &mut earlier);
        r.admit(20 * MS, 102, 102);
        r.poll_transmit(20 * MS, &mut Vec::new());
        let a = s.handle(22 * MS, A, earlier.remove(0));
        r.handle_reply(22 * MS, a);
        let rto = r.retransmit_ns();
        r.handle_timeout(20 * MS + rto);
        assert_eq!(r.counters.retransmits, 1, "not silent since 22 ms");
        r.handle_timeout(22 * MS + rto);
        assert_eq!(r.counters.retransmits, 2);
        assert_eq!(r.check_bookkeeping(), Ok(()));
    }

    /// A store that answers in rounds (a pipeline: the requests that come while a round is
    /// worked on wait for the next), each round's answers at once, the oldest first, and
    /// rounds growing as new flows come in waves faster than it answers: the silence while
    /// a round is worked on is no sign of loss, and nothing is sent again.
    #[test]
    fn a_store_answering_in_rounds_is_waited_for() {
        let mut r = Replica::new(
            A,
            ReplicaConfig {
                park_limit: 10_000,
                lease_ns: 1_000 * MS,
                asks_from: 10_000,
                ..config()
            },
        );
        let mut s = StoreCore::new(StoreConfig::default());
        let (mut waiting, mut working) = (Vec::new(), Vec::new());
        let mut round_ends = 0;
        let (mut key, mut installed) = (0u32, 0);
        for now in (0..600 * MS).step_by(MS as usize / 4) {
            if now >= round_ends {
                for q in working.drain(..) {
                    let a = s.handle(now, A, q);
                    r.handle_reply(now, a);
                }
                working = std::mem::take(&mut waiting);
                // A round takes 0.5 ms a request.
                round_ends = now + (working.len() as u64 * MS / 2).max(MS / 4);
            }
            // New flows in waves: none, then many.
            if now < 400 * MS && (now / (10 * MS)) % 5 == 1 {
                key += 1;
                r.admit(now, key, u64::from(key));
            }
            installed += work(&mut r, now);
            r.poll_transmit(now, &mut waiting);
        }
        assert_eq!(installed, key as usize, "every flow's lease granted");
        assert_eq!(r.counters.retransmits, 0);
    }

    /// The flows whose leases `out` asks for, in order.
    fn asked(out: &[Request<u32, u64>]) -> Vec<u32> {
        (out.iter())
            .filter_map(|q| match q {
                Request::Acquire { key, .. } => Some(*key),
                _ => None,
            })
            .collect()
    }

    /// A replica whose asks wait past 2 unanswered, and a store, with a packet of each of
    /// flows 1 to 4 held for its lease (the park full: `config`'s 4).
    fn four_flows_asking_through_a_window_of_two() -> (Replica<u32, u64>, StoreCore<u32, u64>) {
        let mut r = Replica::new(
            A,
            ReplicaConfig {
                asks_from: 2,
                ..config()
            },
        );
        for key in 1..=4 {
            assert_eq!(r.admit(0, key, u64::from(key)), Admit::Parked);
        }
        (r, StoreCore::new(StoreConfig::default()))
    }

    /// With asks waiting for room and the park full, a packet more (of a new flow, or of
    /// a flow whose ask waits) is dropped; the asks go in order as answers come, the flow
    /// that came once the park had room behind those waiting before it.
    #[test]
    fn a_full_park_drops_new_packets_while_asks_wait_and_loses_no_ask_waiting() {
        let (mut r, mut s) = four_flows_asking_through_a_window_of_two();
        let full = Admit::Dropped(DropReason::ParkFull);
        assert_eq!(r.admit(0, 5, 5), full);
        assert_eq!(r.admit(0, 3, 33), full);
        let mut first = Vec::new();
        r.poll_transmit(0, &mut first);
        assert_eq!(asked(&first), [1, 2]);
        assert_eq!(r.check_bookkeeping(), Ok(()));

        // Flow 1's grant lets its packet go: the park has room for flow 5, whose ask
        // waits behind flows 3 and 4.
        let a = s.handle(MS, A, first.remove(0));
        r.handle_reply(MS, a);
        for e in events(&mut r) {
            if let Event::Process { key, token } = e {
                assert_eq!(r.processed(MS, key, token, None, u64::MAX), Release::Now);
            }
        }
        assert_eq!(r.admit(MS, 5, 55), Admit::Parked);
        let mut second = Vec::new();
        r.poll_transmit(MS, &mut second);
        assert_eq!(asked(&second), [3]);
        assert_eq!(r.check_bookkeeping(), Ok(()));

        // Flows 2 and 3 answered: flows 4 and 5 ask, in that order.
        for q in first.into_iter().chain(second) {
            let a = s.handle(2 * MS, A, q);
            r.handle_reply(2 * MS, a);
        }
        let mut third = Vec::new();
        r.poll_transmit(2 * MS, &mut third);
        assert_eq!(asked(&third), [4, 5]);
        assert_eq!(r.check_bookkeeping(), Ok(()));
    }

    /// Asks wait, in order, while `asks_from` requests are unanswered, and go as answers
    /// make room; a write of a lease held is never held back; an ask whose packets were
    /// dropped while it waited is never sent, and its flow is forgotten.
    #[test]
    fn asks_wait_for_room_and_writes_never_do() {
        let (mut r, mut s) = four_flows_asking_through_a_window_of_two();
        let mut first = Vec::new();
        r.poll_transmit(0, &mut first);
        assert_eq!(asked(&first), [1, 2]);
        let mut none = Vec::new();
        r.poll_transmit(0, &mut none);
        assert_eq!(none, []);

        // Flow 1's grant makes room for flow 3's ask (not 4's), and flow 1's write goes
        // though the window is full.
        let a = s.handle(MS, A, first.remove(0));
        r.handle_reply(MS, a);
        for e in events(&mut r) {
            if let Event::Process { key, token } = e {
                assert_eq!(
                    r.processed(MS, key, token, Some(9), u64::MAX),
                    Release::Parked
                );
            }
        }
        let mut out = Vec::new();
        r.poll_transmit(MS, &mut out);
        assert_eq!(asked(&out), [3]);
        assert!(
            (out.iter()).any(|q| matches!(q, Request::Write { key: 1, .. })),
            "{out:?}"
        );
        assert_eq!(r.check_bookkeeping(), Ok(()));

        // Nothing answered for the park timeout (150 ms): the packets waiting are dropped,
        // flow 4's among them, and its ask, still waiting, is never sent.
        let mut sent = out;
        sent.extend(first);
        while let Some(t) = r.poll_timeout().filter(|&t| t <= 160 * MS) {
            r.handle_timeout(t);
            r.poll_transmit(t, &mut sent);
        }
        let dropped: Vec<Token> = (events(&mut r).into_iter())
            .filter_map(|e| match e {
                Event::Drop { token, .. } => Some(token),
                _ => None,
            })
            .collect();
        assert!(dropped.contains(&4), "{dropped:?}");
        for q in sent {
            let a = s.handle(161 * MS, A, q);
            r.handle_reply(161 * MS, a);
        }
        // Flow 1's write came after its lease (fenced): the flow asks for the lease
        // again, so that the state its packet made is written though the packet was
        // dropped; flow 4's ask is never sent.
        let mut out = Vec::new();
        r.poll_transmit(161 * MS, &mut out);
        assert_eq!(asked(&out), [1]);
        assert_eq!(r.check_bookkeeping(), Ok(()));
        for q in out {
            let a = s.handle(161 * MS, A, q);
            r.handle_reply(161 * MS, a);
        }
        advance(&mut r, &mut s, 162 * MS);
        assert!(r.flows.get(&4).is_none(), "flow 4 forgotten");
        assert_eq!(s.record(&1).and_then(|r| r.value), Some(9));
        assert_eq!(r.counters.retaken, 1);
    }

    /// Flow 7 granted at 0 (a 100 ms lease) and written (1); at 80 ms packet 2 changes it
    /// (2) and packet 3 reads it: the write they wait for, returned unsent.
    fn flow_7_written_then_changed_near_its_lease_end(
        r: &mut Replica<u32, u64>,
        s: &mut StoreCore<u32, u64>,
    ) -> Request<u32, u64> {
        r.admit(0, 7, 1);
        round_trip(r, s, 0);
        events(r);
        r.processed(0, 7, 1, Some(1), u64::MAX);
        round_trip(r, s, 0);
        events(r);
        assert_eq!(r.admit(80 * MS, 7, 2), Admit::Process);
        assert_eq!(
            r.processed(80 * MS, 7, 2, Some(2), u64::MAX),
            Release::Parked
        );
        assert_eq!(r.admit(80 * MS, 7, 3), Admit::Process);
        assert_eq!(r.processed(80 * MS, 7, 3, None, u64::MAX), Release::Parked);
        let mut out = Vec::new();
        r.poll_transmit(80 * MS, &mut out);
        assert!(
            matches!(out[..], [Request::Write { seq: 2, .. }]),
            "{out:?}"
        );
        out.remove(0)
    }

    fn released(events: &[Event<u32, u64>]) -> Vec<Token> {
        (events.iter())
            .filter_map(|e| match e {
                Event::Release { token, .. } => Some(*token),
                _ => None,
            })
            .collect()
    }

    /// A write reaching the store after its lease there (a store or link gone longer than
    /// the lease) is fenced; with nobody having written since, the flow takes the lease
    /// again and the write goes under it: its outputs leave, nothing is dropped.
    #[test]
    fn a_fenced_write_goes_under_the_lease_taken_again_if_nobody_wrote_since() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        let write = flow_7_written_then_changed_near_its_lease_end(&mut r, &mut s);
        let fenced = s.handle(200 * MS, A, write);
        assert!(matches!(fenced, Reply::Fenced { .. }), "{fenced:?}");
        r.handle_reply(200 * MS, fenced);
        assert_eq!(events(&mut r), []);
        // A packet meanwhile waits behind the outputs, for the lease.
        assert_eq!(r.admit(200 * MS, 7, 4), Admit::Parked);
        assert_eq!(r.check_bookkeeping(), Ok(()));
        // The lease, then the write again (under the new epoch).
        round_trip(&mut r, &mut s, 200 * MS);
        assert_eq!(events(&mut r), [], "nothing installed over the changes");
        round_trip(&mut r, &mut s, 200 * MS);
        let after = events(&mut r);
        assert_eq!(released(&after), [2, 3]);
        assert!(
            matches!(after[..], [_, _, Event::Process { token: 4, .. }]),
            "{after:?}"
        );
        assert_eq!(s.record(&7).and_then(|r| r.value), Some(2));
        assert_eq!((r.counters.retaken, r.counters.dropped_fenced), (1, 0));
        assert_eq!(r.check_bookkeeping(), Ok(()));
    }

    /// A write the store applied, its answer lost, sent again after the lease and fenced:
    /// the lease taken again shows it applied under this side's lease, so its outputs
    /// leave and it is not written twice.
    #[test]
    fn a_fenced_write_the_store_had_applied_is_acknowledged_by_the_lease_taken_again() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        let write = flow_7_written_then_changed_near_its_lease_end(&mut r, &mut s);
        let lost = s.handle(90 * MS, A, write.clone());
        assert!(matches!(lost, Reply::Written { seq: 2, .. }), "{lost:?}");
        // The lease that write renewed there ends at 190 ms.
        let fenced = s.handle(200 * MS, A, write);
        assert!(matches!(fenced, Reply::Fenced { .. }), "{fenced:?}");
        r.handle_reply(200 * MS, fenced);
        let writes = r.counters.writes;
        round_trip(&mut r, &mut s, 200 * MS);
        assert_eq!(released(&events(&mut r)), [2, 3]);
        round_trip(&mut r, &mut s, 200 * MS);
        assert_eq!(r.counters.writes, writes, "not written again");
        assert_eq!(s.record(&7).map(|r| r.seq), Some(2));
        assert_eq!((r.counters.retaken, r.counters.dropped_fenced), (1, 0));
    }

    /// Another holder's write of the same number and state as this side's refused one
    /// (two counts of one state) is not taken for this side's: its outputs are dropped.
    #[test]
    fn a_fenced_write_is_given_up_when_another_holder_wrote_its_number_and_state() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        let write = flow_7_written_then_changed_near_its_lease_end(&mut r, &mut s);
        let b = Holder { switch: 2, ..A };
        let Reply::Granted { epoch, .. } = s.handle(150 * MS, b, acquire(7)) else {
            panic!("not granted");
        };
        let same = s.handle(151 * MS, b, write_of(7, epoch, 2, 2));
        assert!(matches!(same, Reply::Written { .. }), "{same:?}");
        let fenced = s.handle(200 * MS, A, write);
        r.handle_reply(200 * MS, fenced);
        round_trip(&mut r, &mut s, 200 * MS);
        let after = events(&mut r);
        assert_eq!(released(&after), [] as [Token; 0]);
        assert_eq!((r.counters.retaken, r.counters.dropped_fenced), (0, 2));
    }

    fn acquire(key: u32) -> Request<u32, u64> {
        Request::Acquire {
            key,
            lease_ns: 10 * MS,
            nonce: 1,
        }
    }

    /// Flow 7's write (its outputs held from 80 ms) fenced at 200 ms, A's lease having
    /// ended at 100 ms, after another holder, B, took the flow at `taken_ns` for 100 ms
    /// and wrote nothing; a packet of it held then, and A's ask for the lease again
    /// answered: B's lease runs, and A waits, holding all.
    fn fenced_while_another_holds(
        r: &mut Replica<u32, u64>,
        s: &mut StoreCore<u32, u64>,
        taken_ns: u64,
    ) {
        let write = flow_7_written_then_changed_near_its_lease_end(r, s);
        let b = Holder { switch: 2, ..A };
        let lease = Request::Acquire {
            key: 7,
            lease_ns: 100 * MS,
            nonce: 1,
        };
        let granted = s.handle(taken_ns, b, lease);
        assert!(matches!(granted, Reply::Granted { .. }), "{granted:?}");
        r.handle_reply(200 * MS, s.handle(200 * MS, A, write));
        assert_eq!(r.admit(200 * MS, 7, 4), Admit::Parked);
        round_trip(r, s, 200 * MS);
        assert_eq!(events(r), []);
        assert!(!r.holds(&7, 200 * MS));
        assert_eq!(r.check_bookkeeping(), Ok(()));
    }

    fn write_of(key: u32, epoch: u64, seq: u64, value: u64) -> Request<u32, u64> {
        Request::Write {
            key,
            epoch,
            seq,
            value,
            lease_ns: 10 * MS,
            keep_ns: KEEP_FOREVER,
            alias: None,
        }
    }

    /// A fenced write whose flow another holder wrote meanwhile is given up: the outputs
    /// waiting for it are dropped (what they saw is not the store's), and the other's
    /// state is installed for the packets after them.
    #[test]
    fn a_fenced_write_is_given_up_if_another_holder_wrote_since() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        let write = flow_7_written_then_changed_near_its_lease_end(&mut r, &mut s);
        let b = Holder { switch: 2, ..A };
        let granted = s.handle(150 * MS, b, acquire(7));
        let Reply::Granted { epoch, seq: 1, .. } = granted else {
            panic!("{granted:?}");
        };
        let written = s.handle(151 * MS, b, write_of(7, epoch, 2, 5));
        assert!(matches!(written, Reply::Written { .. }), "{written:?}");
        let fenced = s.handle(200 * MS, A, write);
        r.handle_reply(200 * MS, fenced);
        assert_eq!(r.admit(200 * MS, 7, 4), Admit::Parked);
        round_trip(&mut r, &mut s, 200 * MS);
        assert_eq!(
            events(&mut r),
            [
                Event::Drop {
                    token: 2,
                    reason: DropReason::Fenced
                },
                Event::Drop {
                    token: 3,
                    reason: DropReason::Fenced
                },
                Event::Install {
                    key: 7,
                    value: Some(5),
                    waited: false
                },
                Event::Process { key: 7, token: 4 },
            ]
        );
        assert_eq!((r.counters.retaken, r.counters.dropped_fenced), (0, 2));
        assert_eq!(r.check_bookkeeping(), Ok(()));
    }

    /// A fenced write's flow asks for its lease again and finds another holder's: it waits
    /// that lease out, its outputs still held, and takes the lease when it passes. That
    /// holder only read, so the write goes under the new lease and nothing is dropped.
    #[test]
    fn a_fenced_write_waits_out_another_holders_lease_and_goes_on_if_that_holder_only_read() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        fenced_while_another_holds(&mut r, &mut s, 110 * MS);
        advance(&mut r, &mut s, 220 * MS);
        let after = events(&mut r);
        assert_eq!(released(&after), [2, 3], "{after:?}");
        assert!(
            matches!(after[..], [_, _, Event::Process { token: 4, .. }]),
            "{after:?}"
        );
        assert_eq!(s.record(&7).map(|r| (r.seq, r.value)), Some((2, Some(2))));
        assert_eq!((r.counters.retaken, r.counters.dropped_fenced), (1, 0));
        assert_eq!(r.check_bookkeeping(), Ok(()));
    }

    /// The same, with the other holder's lease running past the time the held outputs may
    /// wait (`park_timeout_ns`): they are dropped as timed out, counted, while the write
    /// waits on; when the lease comes, the write goes under it (the state the worker holds
    /// is what the store gets), and the packet held for the lease is processed.
    #[test]
    fn outputs_held_for_a_fenced_write_time_out_while_another_holders_lease_runs() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        fenced_while_another_holds(&mut r, &mut s, 150 * MS);
        // Held from 80 ms, the outputs wait 150 ms at most.
        advance(&mut r, &mut s, 240 * MS);
        let timed_out = events(&mut r);
        assert_eq!(
            timed_out,
            [
                Event::Drop {
                    token: 2,
                    reason: DropReason::TimedOut
                },
                Event::Drop {
                    token: 3,
                    reason: DropReason::TimedOut
                },
            ]
        );
        assert_eq!(r.check_bookkeeping(), Ok(()));
        advance(&mut r, &mut s, 260 * MS);
        let after = events(&mut r);
        assert!(
            matches!(after[..], [Event::Process { key: 7, token: 4 }]),
            "{after:?}"
        );
        assert_eq!(s.record(&7).map(|r| (r.seq, r.value)), Some((2, Some(2))));
        assert_eq!((r.counters.retaken, r.counters.dropped_fenced), (1, 0));
        assert_eq!(r.check_bookkeeping(), Ok(()));
    }

    #[test]
    fn another_holder_is_waited_for_and_its_state_migrates() {
        let mut s = StoreCore::new(StoreConfig::default());
        let mut a = Replica::new(A, config());
        let mut b = Replica::new(
            Holder {
                switch: 2,
                incarnation: 0,
            },
            config(),
        );
        a.admit(0, 7, 1);
        round_trip(&mut a, &mut s, 0);
        events(&mut a);
        a.processed(0, 7, 1, Some(9), u64::MAX);
        round_trip(&mut a, &mut s, 0);
        // A dies here. B gets the flow's packets.
        assert_eq!(b.admit(10 * MS, 7, 1), Admit::Parked);
        round_trip(&mut b, &mut s, 10 * MS);
        assert!(events(&mut b).is_empty(), "A's lease runs");
        assert!(!b.holds(&7, 50 * MS));
        advance(&mut b, &mut s, 99 * MS);
        assert!(
            events(&mut b).is_empty(),
            "B asks again only when A's lease has passed"
        );
        advance(&mut b, &mut s, 100 * MS);
        assert_eq!(
            events(&mut b),
            [
                Event::Install {
                    key: 7,
                    value: Some(9),
                    waited: true
                },
                Event::Process { key: 7, token: 1 },
            ]
        );
        assert_eq!((b.counters.migrated, b.counters.waited), (1, 1));
        assert!(b.holds(&7, 100 * MS) && !a.holds(&7, 100 * MS));
    }

    #[test]
    fn the_park_bound_and_timeout_drop_packets_never_state() {
        let mut r = Replica::new(A, config());
        for token in 0..4 {
            assert_eq!(r.admit(0, 7, token), Admit::Parked);
        }
        assert_eq!(r.admit(0, 8, 9), Admit::Dropped(DropReason::ParkFull));
        assert_eq!(r.counters.parked_peak, 4);
        // The store never answers.
        let mut t = 0;
        while let Some(next) = r.poll_timeout() {
            t = next;
            r.handle_timeout(t);
            r.poll_transmit(t, &mut Vec::new());
            if r.parked() == 0 {
                break;
            }
        }
        assert_eq!(t, 150 * MS);
        assert_eq!(
            events(&mut r),
            (0..4)
                .map(|token| Event::Drop {
                    token,
                    reason: DropReason::TimedOut
                })
                .collect::<Vec<_>>()
        );
        assert_eq!(r.counters.dropped_timed_out, 4);
    }

    #[test]
    fn leases_of_flows_in_use_are_renewed_and_idle_flows_are_forgotten() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        r.admit(0, 7, 1);
        round_trip(&mut r, &mut s, 0);
        events(&mut r);
        r.processed(0, 7, 1, None, u64::MAX);
        // Read at 40 ms: in use, so renewed halfway (the lease ends at 99 ms here).
        assert_eq!(r.admit(40 * MS, 7, 2), Admit::Process);
        r.processed(40 * MS, 7, 2, None, u64::MAX);
        advance(&mut r, &mut s, 48 * MS);
        assert_eq!(r.counters.renewals, 0);
        advance(&mut r, &mut s, 49 * MS);
        assert_eq!(r.counters.renewals, 1);
        assert!(r.holds(&7, 140 * MS));
        // Unused since: the lease ends and the flow is forgotten.
        while let Some(t) = r.poll_timeout() {
            r.handle_timeout(t);
            round_trip(&mut r, &mut s, t);
        }
        assert_eq!(events(&mut r), [Event::Forget { key: 7 }]);
        assert_eq!(r.flows(), 0);
    }

    /// A store fallen behind (a request unanswered for 30 ms, where answers took 1 ms) is
    /// taken to be that far away: a packet whose lease ends sooner asks for it again
    /// rather than make a write that would reach the store after the lease. Once the
    /// store catches up, its measured round trip counts again.
    #[test]
    fn a_store_fallen_behind_is_taken_to_be_as_far_as_its_oldest_unanswered_request() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        for key in [7, 9] {
            r.admit(0, key, u64::from(key));
        }
        let mut out = Vec::new();
        r.poll_transmit(0, &mut out);
        for q in out {
            let a = s.handle(MS, A, q);
            r.handle_reply(MS, a);
        }
        for e in events(&mut r) {
            if let Event::Process { key, token } = e {
                r.processed(MS, key, token, None, u64::MAX);
            }
        }
        // Both leases end at 99 ms here. Flow 8's ask, at 50 ms, goes unanswered.
        let mut late = Vec::new();
        r.admit(50 * MS, 8, 8);
        r.poll_transmit(50 * MS, &mut late);
        // At 80 ms, 19 ms before flow 7's lease ends, the store is 30 ms behind.
        assert_eq!(r.admit(80 * MS, 7, 70), Admit::Parked);
        assert!(matches!(
            r.flows.get(&7).map(|f| &f.lease),
            Some(Lease::Acquiring { .. })
        ));
        // Caught up at 81 ms, the oldest request unanswered counts no more; the round
        // trip it took (31 ms, after two of 1 ms) makes the measured one vary that much
        // that the reach is at its cap (a quarter lease): a packet of flow 9, 18 ms
        // before its lease ends, waits for the lease again too.
        let a = s.handle(81 * MS, A, late.remove(0));
        r.handle_reply(81 * MS, a);
        assert!(r.sent_unanswered.is_empty());
        assert_eq!(r.reach_ns(81 * MS), 25 * MS);
        assert_eq!(r.admit(81 * MS, 9, 90), Admit::Parked);
    }

    /// A store that answered in a millisecond stalls, with no request unanswered to
    /// warn of it (a server descheduled on a busy host): a packet with less than an
    /// eighth of its lease left asks for the lease again rather than make a write the
    /// stall would bring to the store after the lease. What happened on a busy host
    /// before the floor: a renewal and a write sent 4.4 ms before the lease's end, after
    /// round trips of a few milliseconds, both fenced 20 ms later.
    #[test]
    fn a_write_is_never_made_in_the_last_eighth_of_a_lease_however_near_the_store_has_been() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        flow_7_granted(&mut r, &mut s, MS);
        // The lease ends at 99 ms here (100 at the store); answers take 1 ms. At 86 ms a
        // write may still be made (13 ms left), at 88 ms not (11 ms: an eighth is 12.5).
        assert_eq!(r.reach_ns(86 * MS), 100 * MS / 8);
        assert_eq!(r.admit(86 * MS, 7, 2), Admit::Process);
        assert_eq!(r.processed(86 * MS, 7, 2, None, u64::MAX), Release::Now);
        // The store stalls for 20 ms: the ask reaches it after the lease, and is granted
        // (a new epoch); the write made under it is taken.
        flow_7_asks_again_and_writes(&mut r, &mut s, 3, [88, 108, 109, 129].map(|t| t * MS));
        assert_eq!(s.counters.fenced, 0);
    }

    /// A store silent for long (here for a thousand leases, a new flow asking every
    /// millisecond, their packets dropped as they time out) leaves the replica keeping
    /// the sendings of a quarter lease at most, and the reach at its cap.
    #[test]
    fn a_store_silent_for_long_leaves_a_quarter_lease_of_sendings_kept() {
        let config = ReplicaConfig {
            park_limit: 1_000_000,
            ..config()
        };
        let quarter = config.lease_ns / 4;
        let mut r = Replica::new(A, config);
        // The store answers the first ask (its round trip is measured), then nothing.
        let mut s = StoreCore::new(StoreConfig::default());
        r.admit(0, u32::MAX, 0);
        round_trip(&mut r, &mut s, 0);
        let mut out = Vec::new();
        let (mut longest, mut asks) = (0, 0);
        for ms in 1..100_000u32 {
            let now = u64::from(ms) * MS;
            r.admit(now, ms, u64::from(ms));
            work(&mut r, now);
            r.poll_transmit(now, &mut out);
            asks += asked(&out).len();
            out.clear();
            longest = longest.max(r.sent_unanswered.len());
            if now > quarter {
                assert_eq!(r.reach_ns(now), quarter, "at {ms} ms");
            }
        }
        assert!(asks > 10_000, "asks kept going as flows gave up: {asks}");
        assert!(
            longest <= (quarter / MS) as usize + 1,
            "{longest} sendings kept"
        );
    }

    /// A renewal due when the worker comes back to its timers too late for it to reach
    /// the store within the lease (a worker busy that long: here with a packet the lease
    /// let through still unprocessed) is not sent: the store would refuse it. The flow
    /// lapses, and its next packet asks for the lease again.
    #[test]
    fn a_renewal_that_would_reach_the_store_after_the_lease_is_not_sent() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        r.admit(0, 7, 1);
        let mut out = Vec::new();
        r.poll_transmit(0, &mut out);
        // Answered in 10 ms: a request takes that long to reach the store.
        let a = s.handle(10 * MS, A, out.remove(0));
        r.handle_reply(10 * MS, a);
        assert!(events(&mut r).contains(&Event::Process { key: 7, token: 1 }));
        // The flow is in use (its packet handed to the worker), so due for renewal at the
        // lease's halfway point (49 ms), but the timers are looked at only at 95 ms, 4 ms
        // before the lease ends here.
        r.handle_timeout(95 * MS);
        let mut out = Vec::new();
        r.poll_transmit(95 * MS, &mut out);
        assert_eq!(out, [], "no renewal");
        assert_eq!(r.counters.renewals, 0);
        advance(&mut r, &mut s, 100 * MS);
        assert_eq!(events(&mut r), [Event::Forget { key: 7 }]);
        assert_eq!(r.admit(101 * MS, 7, 2), Admit::Parked);
    }

    #[test]
    fn writes_and_renewals_tell_the_store_when_the_state_times_out_here() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        for key in [7, 8] {
            r.admit(0, key, u64::from(key));
        }
        round_trip(&mut r, &mut s, 0);
        events(&mut r);
        // Both flows' entries are written at 0 and time out 300 ms after their last packet.
        for key in [7, 8] {
            r.processed(0, key, u64::from(key), Some(1), 300 * MS);
        }
        let mut out = Vec::new();
        r.poll_transmit(0, &mut out);
        assert!(
            out.iter()
                .all(|q| matches!(q, Request::Write { keep_ns, .. } if *keep_ns == 400 * MS)),
            "the time left, and a lease: {out:?}"
        );
        for q in out {
            let a = s.handle(0, A, q);
            r.handle_reply(0, a);
        }
        events(&mut r);
        // Flow 7 is read at 40 ms, so its entry lives to 340 ms, and its renewal says so.
        assert_eq!(r.admit(40 * MS, 7, 9), Admit::Process);
        r.processed(40 * MS, 7, 9, None, 340 * MS);
        while let Some(t) = r.poll_timeout() {
            r.handle_timeout(t);
            round_trip(&mut r, &mut s, t);
        }
        // Flow 7, read within a quarter lease of its halfway point, is renewed once; flow 8,
        // used only by the packet that asked for its lease, is not (its write's 400 ms
        // stands at the store).
        assert_eq!(r.counters.renewals, 1);
        assert_eq!(r.flows(), 0, "both forgotten here");
        // At 420 ms another switch takes both: flow 8 timed out (at 400 ms, a lease after
        // its entry would have), flow 7 lives (to 440 ms).
        let mut b = Replica::new(
            Holder {
                switch: 2,
                incarnation: 0,
            },
            config(),
        );
        for key in [7, 8] {
            b.admit(420 * MS, key, u64::from(key));
        }
        round_trip(&mut b, &mut s, 420 * MS);
        let installs: Vec<_> = events(&mut b)
            .into_iter()
            .filter_map(|e| match e {
                Event::Install { key, value, .. } => Some((key, value)),
                _ => None,
            })
            .collect();
        assert_eq!(installs, [(7, Some(1)), (8, None)]);
        assert_eq!(s.counters.timed_out, 1);
    }

    #[test]
    fn a_flow_whose_packets_the_worker_has_yet_to_process_keeps_its_lease() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        for token in 1..=3 {
            assert_eq!(r.admit(0, 7, token), Admit::Parked);
        }
        round_trip(&mut r, &mut s, 0);
        assert_eq!(events(&mut r).len(), 4, "the install and three to process");
        r.processed(0, 7, 1, None, u64::MAX);
        // The worker's backlog holds the other two for 250 ms (two and a half leases).
        advance(&mut r, &mut s, 250 * MS);
        assert!(r.counters.renewals >= 4, "{:?}", r.counters);
        assert!(r.holds(&7, 250 * MS));
        assert!(events(&mut r).is_empty(), "not forgotten");
        for token in 2..=3 {
            assert_eq!(
                r.processed(250 * MS, 7, token, None, u64::MAX),
                Release::Now
            );
        }
        // Then unused: its lease lapses and it is forgotten.
        advance(&mut r, &mut s, 600 * MS);
        assert_eq!(events(&mut r), [Event::Forget { key: 7 }]);
    }

    #[test]
    fn a_packet_near_its_lease_end_waits_for_the_lease_again_rather_than_risk_a_fenced_write() {
        let mut r = Replica::new(A, config());
        let mut s = StoreCore::new(StoreConfig::default());
        // The store takes the ask at once; its answer takes 30 ms to come back.
        flow_7_granted(&mut r, &mut s, 30 * MS);
        // At 60 ms a write would reach the store (30 ms away) well within its lease.
        assert_eq!(r.admit(60 * MS, 7, 2), Admit::Process);
        assert_eq!(r.processed(60 * MS, 7, 2, None, u64::MAX), Release::Now);
        // At 80 ms it would reach it at 110 ms, past the lease's end (100 ms): the packet
        // waits for the lease again instead.
        let written =
            flow_7_asks_again_and_writes(&mut r, &mut s, 3, [80, 110, 140, 170].map(|t| t * MS));
        r.handle_reply(200 * MS, written);
        let mut out = Vec::new();
        assert!(events(&mut r).contains(&Event::Release {
            token: 3,
            epoch: 2,
            seq: 1
        }));
        assert_eq!(s.counters.fenced, 0);
        // The flow has state now; idle until 290 ms, its packet asks again while the
        // store's lease (to 270 ms) runs: the same epoch, granted with the flow's own
        // state, which is no migration.
        assert_eq!(r.counters.migrated, 0);
        assert_eq!(r.admit(265 * MS, 7, 4), Admit::Parked);
        r.poll_transmit(265 * MS, &mut out);
        let granted = s.handle(266 * MS, A, out.remove(0));
        assert!(
            matches!(
                granted,
                Reply::Granted {
                    epoch: 2,
                    value: Some(5),
                    ..
                }
            ),
            "{granted:?}"
        );
        r.handle_reply(296 * MS, granted);
        assert!(events(&mut r).contains(&Event::Process { key: 7, token: 4 }));
        assert_eq!(r.counters.migrated, 0);
    }

    /// A steady flow's packet is admitted as [`Replica::admit_placed`] would have admitted
    /// it: `Process`, with nothing else done (no renewal, no ask, the same counts), in
    /// random runs of packets that change their flow's state or not, answers lost or
    /// late, leases that lapse and renew.
    #[test]
    fn a_steady_flow_is_admitted_as_admission_would_admit_it() {
        for seed in 1..=40u64 {
            let mut next = draws(seed);
            let mut r: Replica<u32, u64> = Replica::new(A, config());
            let mut s = StoreCore::new(StoreConfig::default());
            let mut states = [0u64; 6];
            let (mut now, mut token, mut steady) = (0u64, 0u64, 0u32);
            for _ in 0..3_000 {
                now += next(4 * MS);
                let key = next(6) as u32;
                if next(10) < 7 {
                    token += 1;
                    if next(10) == 0 {
                        states[key as usize] += 1;
                    }
                    let before = r.clone();
                    let places = match r.admit_steady(now, &key) {
                        Some(places) => {
                            steady += 1;
                            let mut twin = before;
                            let (admit, _) = twin.admit_placed(now, key, token);
                            assert_eq!(admit, Admit::Process, "seed {seed}, flow {key} at {now}");
                            assert_eq!(twin.counters, r.counters, "seed {seed} at {now}");
                            let (mut asked, mut asked_twin) = (Vec::new(), Vec::new());
                            r.clone().poll_transmit(now, &mut asked);
                            twin.poll_transmit(now, &mut asked_twin);
                            assert_eq!(asked, asked_twin, "seed {seed}, flow {key} at {now}");
                            places
                        }
                        None => match r.admit_placed(now, key, token) {
                            (Admit::Process, places) => places,
                            _ => continue,
                        },
                    };
                    let state = states[key as usize];
                    r.processed_with_state(now, key, token, &state, places, u64::MAX);
                } else {
                    lossy_store_step(&mut r, &mut s, now, &mut next, &states);
                }
                r.check_bookkeeping().unwrap();
            }
            assert!(
                steady > 300,
                "seed {seed}: only {steady} packets admitted steady"
            );
        }
    }

    /// A flow the program holds marked steady ([`Replica::tell_steady`], the marks made
    /// and taken away applied as told) has its packets admitted as
    /// [`Replica::admit_placed`] would have admitted them: `Process`, with nothing else
    /// asked; the program processes them with nothing asked of the replica, and tells it
    /// only of a change. Random runs as above; the program's marks never outlast the
    /// replica's own.
    #[test]
    fn a_flow_marked_in_the_program_is_admitted_as_admission_would_admit_it() {
        for seed in 1..=40u64 {
            let mut next = draws(seed);
            let mut r: Replica<u32, u64> = Replica::new(A, config());
            r.tell_steady();
            let mut s = StoreCore::new(StoreConfig::default());
            let mut states = [0u64; 6];
            let mut program: std::collections::HashMap<u32, u64> = Default::default();
            let mut told = Vec::new();
            let (mut now, mut token, mut marked) = (0u64, 0u64, 0u32);
            for _ in 0..3_000 {
                now += next(4 * MS);
                let key = next(6) as u32;
                if next(10) < 7 {
                    token += 1;
                    let changes = next(10) == 0;
                    if changes {
                        states[key as usize] += 1;
                    }
                    let state = states[key as usize];
                    if program.get(&key).is_some_and(|&until| now < until) {
                        marked += 1;
                        let mut twin = r.clone();
                        let (admit, places) = twin.admit_placed(now, key, token);
                        assert_eq!(admit, Admit::Process, "seed {seed}, flow {key} at {now}");
                        r.admitted_steady(1);
                        assert_eq!(twin.counters, r.counters, "seed {seed} at {now}");
                        // Unchanged, its output leaves at once, as the program lets it.
                        let latest = r.flows.get(&key).and_then(|f| f.latest().copied());
                        let before = latest.unwrap_or_default();
                        let (release, changed) = (twin.clone()).processed_with_state(
                            now,
                            key,
                            token,
                            &before,
                            places,
                            u64::MAX,
                        );
                        assert_eq!(
                            (release, changed),
                            (Release::Now, false),
                            "seed {seed}, flow {key} at {now}"
                        );
                        let (mut asked, mut asked_twin) = (Vec::new(), Vec::new());
                        r.clone().poll_transmit(now, &mut asked);
                        twin.poll_transmit(now, &mut asked_twin);
                        assert_eq!(asked, asked_twin, "seed {seed}, flow {key} at {now}");
                        if changes {
                            r.processed_with_state(now, key, token, &state, places, u64::MAX);
                        }
                    } else if let (Admit::Process, places) = r.admit_placed(now, key, token) {
                        r.processed_with_state(now, key, token, &state, places, u64::MAX);
                    }
                } else {
                    lossy_store_step(&mut r, &mut s, now, &mut next, &states);
                }
                r.take_steady_told(&mut told);
                for (key, until) in told.drain(..) {
                    match until {
                        Some(until) => program.insert(key, until),
                        None => program.remove(&key),
                    };
                }
                r.check_bookkeeping().unwrap();
            }
            assert!(
                marked > 300,
                "seed {seed}: only {marked} packets processed under the program's mark"
            );
        }
    }
}
