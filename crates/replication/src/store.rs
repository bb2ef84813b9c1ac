//! The store's side of each step, on the store's clock: a flow's lease (one holder at a
//! time, for a bounded time), its fencing epoch (raised at each grant to a new holder) and
//! its sequenced writes. [`StoreCore`] is the in-process `memory` store, and the
//! specification the Redis functions follow line for line.
//!
//! Must never: grant a flow's lease while another holder's runs; apply a write of a
//! holder whose lease passed or was granted away, or one older than the state held.

use crate::protocol::{Holder, KEEP_FOREVER, Reply, Request};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;

#[derive(Clone, Copy, Debug)]
pub struct StoreConfig {
    /// Leases asked for are held to this range.
    pub min_lease_ns: u64,
    pub max_lease_ns: u64,
    /// Refuse writes and renewals of a lease that passed or was granted away. Off only to
    /// show, in tests, what goes wrong without it (the paper's prototype does not fence).
    pub fencing: bool,
    /// A record is dropped this long after the last call that granted, wrote or renewed
    /// its lease, or when its state times out if that is later (the Redis functions'
    /// `retain_ms`): flows long gone take no memory. Far longer than any lease, so that a
    /// record lasts while its epoch can matter.
    pub retain_ns: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            min_lease_ns: 1_000_000,
            max_lease_ns: 60_000_000_000,
            fencing: true,
            retain_ns: 3_600_000_000_000,
        }
    }
}

/// One flow's record.
#[derive(Clone, Debug)]
pub struct Record<V> {
    pub value: Option<V>,
    /// The last write applied (0: none), and the epoch of the lease it was applied under.
    pub seq: u64,
    pub written_epoch: u64,
    /// The last grant's epoch (0: never granted).
    pub epoch: u64,
    pub holder: Option<Holder>,
    pub lease_until_ns: u64,
    /// When `value` times out: a grant from then on finds no state (the epoch and the
    /// sequence number stay, so fencing and ordering hold across it).
    pub value_until_ns: u64,
    /// When the store drops the record ([`StoreConfig::retain_ns`]).
    pub expires_ns: u64,
    /// When its entry in the store's expiry queue comes up (`None`: it has none).
    queued_ns: Option<u64>,
}

impl<V> Default for Record<V> {
    fn default() -> Self {
        Record {
            value: None,
            seq: 0,
            written_epoch: 0,
            epoch: 0,
            holder: None,
            lease_until_ns: 0,
            value_until_ns: u64::MAX,
            expires_ns: 0,
            queued_ns: None,
        }
    }
}

impl<V> Record<V> {
    /// A call granted, wrote or renewed the lease at `now_ns`: the record is kept
    /// `retain_ns` from now at least, never less than it was (its state may live longer).
    fn extend(&mut self, now_ns: u64, retain_ns: u64) {
        self.expires_ns = self.expires_ns.max(now_ns.saturating_add(retain_ns));
    }

    /// The state applied or renewed at `now_ns` lives `keep_ns` (`KEEP_FOREVER`: until
    /// written again); the record at least as long (Redis's `keep`).
    fn keep(&mut self, now_ns: u64, keep_ns: u64, retain_ns: u64) {
        if keep_ns == KEEP_FOREVER {
            self.value_until_ns = u64::MAX;
            return;
        }
        self.value_until_ns = now_ns.saturating_add(keep_ns);
        if keep_ns > retain_ns {
            self.expires_ns = self.value_until_ns;
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreCounters {
    pub granted: u64,
    /// Grants to a new holder of a flow that had state: migrations.
    pub migrated: u64,
    pub held: u64,
    pub written: u64,
    /// Writes answered again without applying (sent again, or older than the state).
    pub repeated: u64,
    pub renewed: u64,
    pub fenced: u64,
    /// States found timed out at a grant, and dropped.
    pub timed_out: u64,
    /// Aliases asked for, and those that named a flow.
    pub resolves: u64,
    pub resolved: u64,
    /// Records dropped past their retention ([`StoreConfig::retain_ns`]).
    pub dropped: u64,
}

/// Records the expiry queue looks at in one call, at most.
const EXPIRIES_PER_CALL: usize = 64;

pub struct StoreCore<K, V> {
    config: StoreConfig,
    records: HashMap<K, Record<V>>,
    /// Each alias a write named, and the flow it names (and back: a flow's alias goes
    /// with its record). An alias is not checked against its flow's state's life: the
    /// flow's grant tells whether it has state.
    aliases: HashMap<K, K>,
    alias_of: HashMap<K, K>,
    /// When each record's expiry is next looked at: at most one entry a record that
    /// counts (its `queued_ns`), so the queue is no longer than the records.
    expiry: BinaryHeap<Reverse<(u64, K)>>,
    pub counters: StoreCounters,
}

impl<K: Copy + Eq + Hash + Ord, V: Clone> StoreCore<K, V> {
    pub fn new(config: StoreConfig) -> Self {
        StoreCore {
            config,
            records: HashMap::new(),
            aliases: HashMap::new(),
            alias_of: HashMap::new(),
            expiry: BinaryHeap::new(),
            counters: StoreCounters::default(),
        }
    }

    /// Drops records whose time has come, with their aliases: at most
    /// [`EXPIRIES_PER_CALL`] looked at, so that a crowd of flows gone at once does not hold
    /// up the call that finds them ([`StoreCore::handle`] drops the record it is asked
    /// about itself when its time has come).
    fn expire(&mut self, now_ns: u64) {
        for _ in 0..EXPIRIES_PER_CALL {
            let Some(&Reverse((at, key))) = self.expiry.peek() else {
                break;
            };
            if at > now_ns {
                break;
            }
            self.expiry.pop();
            let Some(record) = self.records.get_mut(&key) else {
                continue;
            };
            if record.queued_ns != Some(at) {
                continue; // A later entry stands for it.
            }
            if record.expires_ns > now_ns {
                record.queued_ns = Some(record.expires_ns);
                self.expiry.push(Reverse((record.expires_ns, key)));
                continue;
            }
            self.drop_record(key);
        }
    }

    /// Drops `key`'s record and its alias (its entry in the expiry queue, if any, is
    /// passed over when it comes up).
    fn drop_record(&mut self, key: K) {
        self.records.remove(&key);
        self.counters.dropped += 1;
        if let Some(alias) = self.alias_of.remove(&key)
            && self.aliases.get(&alias) == Some(&key)
        {
            self.aliases.remove(&alias);
        }
    }

    /// Queues `key`'s record for its expiry, if it is not queued for that time or earlier.
    fn queue(&mut self, key: K) {
        if let Some(record) = self.records.get_mut(&key)
            && record.queued_ns.is_none_or(|at| at > record.expires_ns)
        {
            record.queued_ns = Some(record.expires_ns);
            self.expiry.push(Reverse((record.expires_ns, key)));
        }
    }

    /// `alias` names flow `key` from now on (and no more the alias it had).
    fn name(&mut self, key: K, alias: K) {
        if let Some(old) = self.alias_of.insert(key, alias)
            && old != alias
            && self.aliases.get(&old) == Some(&key)
        {
            self.aliases.remove(&old);
        }
        self.aliases.insert(alias, key);
    }

    pub fn record(&self, key: &K) -> Option<&Record<V>> {
        self.records.get(key)
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn resolve(&mut self, alias: K, nonce: u64) -> Reply<K, V> {
        let flow = self.aliases.get(&alias).copied();
        self.counters.resolves += 1;
        self.counters.resolved += u64::from(flow.is_some());
        Reply::Resolved { alias, flow, nonce }
    }

    /// Answers `request` of `from`, taken at `now_ns` on the store's clock.
    pub fn handle(&mut self, now_ns: u64, from: Holder, request: Request<K, V>) -> Reply<K, V> {
        self.expire(now_ns);
        let key = request.key();
        if self
            .records
            .get(&key)
            .is_some_and(|r| r.expires_ns <= now_ns)
        {
            self.drop_record(key);
        }
        let had = self.records.contains_key(&key);
        let reply = self.answer(now_ns, from, request);
        match reply {
            // Refused: a record the store had not is none (Redis reads it and writes
            // nothing).
            Reply::Fenced { .. } | Reply::Held { .. } if !had => {
                self.records.remove(&key);
            }
            Reply::Resolved { .. } => {}
            _ => self.queue(key),
        }
        reply
    }

    fn answer(&mut self, now_ns: u64, from: Holder, request: Request<K, V>) -> Reply<K, V> {
        let config = self.config;
        let lease = |asked: u64| asked.clamp(config.min_lease_ns, config.max_lease_ns);
        let key = request.key();
        // An alias has no record of its own.
        if let Request::Resolve { alias, nonce } = request {
            return self.resolve(alias, nonce);
        }
        let record = self.records.entry(key).or_default();
        let runs = now_ns < record.lease_until_ns;
        let holds = |record: &Record<V>, epoch: u64| {
            !config.fencing || (record.holder == Some(from) && record.epoch == epoch && runs)
        };
        match request {
            Request::Acquire {
                lease_ns, nonce, ..
            } => {
                let lease_ns = lease(lease_ns);
                match record.holder {
                    // The holder asking again (its answer lost, or its own lease thought
                    // passed early): the same grant, renewed.
                    Some(h) if h == from && runs => {}
                    Some(_) if runs => {
                        self.counters.held += 1;
                        return Reply::Held {
                            key,
                            remaining_ns: record.lease_until_ns - now_ns,
                            nonce,
                        };
                    }
                    _ => {
                        record.epoch += 1;
                        record.holder = Some(from);
                        if record.value.is_some() {
                            self.counters.migrated += 1;
                        }
                    }
                }
                if record.value.is_some() && now_ns >= record.value_until_ns {
                    record.value = None;
                    self.counters.timed_out += 1;
                }
                record.lease_until_ns = now_ns.saturating_add(lease_ns);
                record.extend(now_ns, config.retain_ns);
                self.counters.granted += 1;
                Reply::Granted {
                    key,
                    epoch: record.epoch,
                    seq: record.seq,
                    value: record.value.clone(),
                    lease_ns,
                    nonce,
                    written_epoch: record.written_epoch,
                }
            }
            Request::Write {
                epoch,
                seq,
                value,
                lease_ns,
                keep_ns,
                alias,
                ..
            } => {
                if !holds(record, epoch) {
                    self.counters.fenced += 1;
                    return Reply::Fenced { key, epoch };
                }
                let lease_ns = lease(lease_ns);
                record.lease_until_ns = now_ns.saturating_add(lease_ns);
                record.extend(now_ns, config.retain_ns);
                if seq > record.seq {
                    record.value = Some(value);
                    (record.seq, record.written_epoch) = (seq, epoch);
                    record.keep(now_ns, keep_ns, config.retain_ns);
                    if let Some(alias) = alias {
                        self.name(key, alias);
                    }
                    self.counters.written += 1;
                } else {
                    self.counters.repeated += 1;
                }
                Reply::Written {
                    key,
                    epoch,
                    seq,
                    lease_ns,
                }
            }
            Request::Renew {
                epoch,
                lease_ns,
                nonce,
                keep_ns,
                ..
            } => {
                if !holds(record, epoch) {
                    self.counters.fenced += 1;
                    return Reply::Fenced { key, epoch };
                }
                let lease_ns = lease(lease_ns);
                record.lease_until_ns = now_ns.saturating_add(lease_ns);
                record.extend(now_ns, config.retain_ns);
                record.keep(now_ns, keep_ns, config.retain_ns);
                self.counters.renewed += 1;
                Reply::Renewed {
                    key,
                    epoch,
                    lease_ns,
                    nonce,
                }
            }
            Request::Resolve { alias, nonce } => self.resolve(alias, nonce),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::KEEP_FOREVER;

    const A: Holder = Holder {
        switch: 1,
        incarnation: 0,
    };
    const B: Holder = Holder {
        switch: 2,
        incarnation: 0,
    };
    const MS: u64 = 1_000_000;

    fn store() -> StoreCore<u32, u64> {
        StoreCore::new(StoreConfig::default())
    }

    fn acquire(s: &mut StoreCore<u32, u64>, now: u64, from: Holder) -> Reply<u32, u64> {
        s.handle(
            now,
            from,
            Request::Acquire {
                key: 7,
                lease_ns: 100 * MS,
                nonce: now,
            },
        )
    }

    fn write(
        s: &mut StoreCore<u32, u64>,
        now: u64,
        from: Holder,
        epoch: u64,
        seq: u64,
        value: u64,
    ) -> Reply<u32, u64> {
        s.handle(
            now,
            from,
            Request::Write {
                key: 7,
                epoch,
                seq,
                value,
                lease_ns: 100 * MS,
                keep_ns: KEEP_FOREVER,
                alias: None,
            },
        )
    }

    #[test]
    fn an_alias_names_its_flow_once_a_write_with_it_is_applied_never_by_a_fenced_one() {
        let mut s = store();
        let resolve = |s: &mut StoreCore<u32, u64>, alias: u32| match s.handle(
            0,
            A,
            Request::Resolve { alias, nonce: 3 },
        ) {
            Reply::Resolved {
                alias: a,
                flow,
                nonce: 3,
            } if a == alias => flow,
            other => panic!("{other:?}"),
        };
        let write_named = |s: &mut StoreCore<u32, u64>, from: Holder, epoch: u64| {
            s.handle(
                MS,
                from,
                Request::Write {
                    key: 7,
                    epoch,
                    seq: 1,
                    value: 5,
                    lease_ns: 100 * MS,
                    keep_ns: KEEP_FOREVER,
                    alias: Some(1007),
                },
            )
        };
        acquire(&mut s, 0, A);
        assert!(matches!(write_named(&mut s, B, 1), Reply::Fenced { .. }));
        assert_eq!(resolve(&mut s, 1007), None, "a refused write names nothing");
        assert!(matches!(write_named(&mut s, A, 1), Reply::Written { .. }));
        assert_eq!(resolve(&mut s, 1007), Some(7));
        assert_eq!(resolve(&mut s, 2000), None);
        assert!(
            s.record(&1007).is_none(),
            "an alias has no record of its own"
        );
        assert_eq!((s.counters.resolves, s.counters.resolved), (3, 1));
    }

    #[test]
    fn records_are_dropped_a_retention_after_their_last_call_or_when_their_state_dies_if_later() {
        const RETAIN: u64 = 1_000 * MS;
        let mut s = StoreCore::new(StoreConfig {
            retain_ns: RETAIN,
            ..StoreConfig::default()
        });
        let call = |s: &mut StoreCore<u32, u64>, now: u64, request| s.handle(now, A, request);
        let write = |key, seq, keep_ns, alias| Request::Write {
            key,
            epoch: 1,
            seq,
            value: 5,
            lease_ns: 100 * MS,
            keep_ns,
            alias,
        };
        let resolve = |alias| Request::Resolve { alias, nonce: 1 };
        // Flow 7 kept forever, named by alias 1007; flow 8 kept 5 s.
        acquire(&mut s, 0, A);
        call(&mut s, 0, write(7, 1, KEEP_FOREVER, Some(1007)));
        let ask = |key| Request::Acquire {
            key,
            lease_ns: 100 * MS,
            nonce: 0,
        };
        call(&mut s, 0, ask(8));
        call(&mut s, 0, write(8, 1, 5_000 * MS, None));
        // A refused call on a flow the store never had leaves nothing behind.
        assert!(matches!(
            call(&mut s, MS, write(9, 1, KEEP_FOREVER, None)),
            Reply::Fenced { .. }
        ));
        assert!(s.record(&9).is_none());
        assert_eq!(s.len(), 2);
        // Within the retention both stay; past it, flow 7 and its alias are gone.
        call(&mut s, RETAIN - MS, resolve(1));
        assert!(s.record(&7).is_some());
        assert!(matches!(
            call(&mut s, RETAIN + MS, resolve(1007)),
            Reply::Resolved { flow: None, .. }
        ));
        assert!(s.record(&7).is_none());
        // Flow 8's state outlives the retention: its record goes when the state dies.
        call(&mut s, 4_999 * MS, resolve(1));
        assert!(s.record(&8).is_some());
        call(&mut s, 5_001 * MS, resolve(1));
        assert!(s.record(&8).is_none());
        assert!(s.is_empty());
        assert_eq!(s.counters.dropped, 2);
        // A flow taken again after gets a lease from a new record.
        assert!(matches!(
            call(&mut s, 6_000 * MS, ask(7)),
            Reply::Granted { value: None, .. }
        ));
    }

    /// Flows gone all at once are dropped a few a call, and a flow asked about past its
    /// retention is answered as gone whatever the queue holds.
    #[test]
    fn records_gone_at_once_are_dropped_a_few_a_call_and_never_answered_from() {
        let mut s = StoreCore::new(StoreConfig {
            retain_ns: 1_000 * MS,
            ..StoreConfig::default()
        });
        let write = |key| Request::Write {
            key,
            epoch: 1,
            seq: 1,
            value: 5,
            lease_ns: 100 * MS,
            keep_ns: KEEP_FOREVER,
            alias: None,
        };
        for key in 0..1_000 {
            let ask = Request::Acquire {
                key,
                lease_ns: 100 * MS,
                nonce: 0,
            };
            s.handle(0, A, ask);
            s.handle(0, A, write(key));
        }
        assert_eq!(s.len(), 1_000);
        // Past the retention: the flow asked about is gone, and a bounded share of the
        // others with it.
        let ask = Request::Acquire {
            key: 999,
            lease_ns: 100 * MS,
            nonce: 1,
        };
        let reply = s.handle(2_000 * MS, B, ask);
        assert!(
            matches!(
                reply,
                Reply::Granted {
                    epoch: 1,
                    value: None,
                    ..
                }
            ),
            "{reply:?}"
        );
        assert!(
            (1_000 - 1 - EXPIRIES_PER_CALL..1_000).contains(&s.len()),
            "{}",
            s.len()
        );
        for _ in 0..1_000 / EXPIRIES_PER_CALL + 1 {
            s.handle(2_000 * MS, B, Request::Resolve { alias: 0, nonce: 0 });
        }
        assert_eq!(s.len(), 1, "only flow 999's new record is left");
    }

    #[test]
    fn one_holder_at_a_time_and_the_next_gets_the_last_write() {
        let mut s = store();
        let Reply::Granted {
            epoch,
            seq: 0,
            value: None,
            ..
        } = acquire(&mut s, 0, A)
        else {
            panic!("a new flow is granted with no state");
        };
        assert_eq!(
            write(&mut s, MS, A, epoch, 1, 10),
            Reply::Written {
                key: 7,
                epoch,
                seq: 1,
                lease_ns: 100 * MS
            }
        );
        // The write renewed the lease: B waits for what is left of it.
        assert_eq!(
            acquire(&mut s, 50 * MS, B),
            Reply::Held {
                key: 7,
                remaining_ns: 51 * MS,
                nonce: 50 * MS
            }
        );
        let Reply::Granted {
            epoch: e2,
            seq: 1,
            value: Some(10),
            ..
        } = acquire(&mut s, 101 * MS, B)
        else {
            panic!("past the lease, B takes the flow with A's last write");
        };
        assert_eq!(e2, epoch + 1, "a new holder raises the epoch");
        assert_eq!(s.counters.migrated, 1);
    }

    #[test]
    fn a_write_of_a_passed_lease_is_fenced_even_if_nobody_took_the_flow() {
        let mut s = store();
        let Reply::Granted { epoch, .. } = acquire(&mut s, 0, A) else {
            panic!()
        };
        assert_eq!(
            write(&mut s, 100 * MS, A, epoch, 1, 10),
            Reply::Fenced { key: 7, epoch }
        );
        assert_eq!(s.record(&7).map(|r| r.seq), Some(0), "nothing applied");
        let Reply::Granted { epoch: e2, .. } = acquire(&mut s, 100 * MS, B) else {
            panic!()
        };
        // A's write on its way, delayed: fenced by the epoch.
        assert_eq!(
            write(&mut s, 101 * MS, A, epoch, 1, 10),
            Reply::Fenced { key: 7, epoch }
        );
        assert_eq!(
            write(&mut s, 101 * MS, B, e2, 1, 11),
            Reply::Written {
                key: 7,
                epoch: e2,
                seq: 1,
                lease_ns: 100 * MS
            }
        );
        // A restarted is a new holder: it waits, then fences B.
        let a1 = Holder {
            incarnation: 1,
            ..A
        };
        assert!(matches!(acquire(&mut s, 150 * MS, a1), Reply::Held { .. }));
        assert_eq!(s.counters.fenced, 2);
    }

    #[test]
    fn writes_sent_again_are_answered_again_and_never_go_back() {
        let mut s = store();
        let Reply::Granted { epoch, .. } = acquire(&mut s, 0, A) else {
            panic!()
        };
        write(&mut s, 1, A, epoch, 1, 10);
        write(&mut s, 2, A, epoch, 2, 20);
        assert!(matches!(
            write(&mut s, 3, A, epoch, 1, 10),
            Reply::Written { seq: 1, .. }
        ));
        let r = s.record(&7).cloned().unwrap_or_default();
        assert_eq!(
            (r.seq, r.value),
            (2, Some(20)),
            "the older write is not applied"
        );
        assert_eq!(s.counters.repeated, 1);
        // The holder asking again keeps its epoch, so its own writes are not fenced.
        let Reply::Granted {
            epoch: again,
            seq: 2,
            value: Some(20),
            ..
        } = acquire(&mut s, 4, A)
        else {
            panic!()
        };
        assert_eq!(again, epoch);
    }

    #[test]
    fn leases_are_held_to_the_configured_range_and_saturate() {
        let mut s = store();
        let r = s.handle(
            u64::MAX - 5,
            A,
            Request::Acquire {
                key: 1,
                lease_ns: 1,
                nonce: 0,
            },
        );
        assert!(matches!(r, Reply::Granted { lease_ns: MS, .. }), "{r:?}");
        assert_eq!(s.record(&1).map(|r| r.lease_until_ns), Some(u64::MAX));
    }

    #[test]
    fn without_fencing_a_stale_write_lands() {
        let mut s = StoreCore::new(StoreConfig {
            fencing: false,
            ..StoreConfig::default()
        });
        let Reply::Granted { epoch, .. } = acquire(&mut s, 0, A) else {
            panic!()
        };
        acquire(&mut s, 200 * MS, B);
        assert!(matches!(
            write(&mut s, 201 * MS, A, epoch, 1, 10),
            Reply::Written { .. }
        ));
    }

    #[test]
    fn a_state_past_its_keep_is_granted_as_none_with_its_epoch_and_sequence_kept() {
        let mut s = store();
        let Reply::Granted { epoch, .. } = acquire(&mut s, 0, A) else {
            panic!()
        };
        let written = s.handle(
            MS,
            A,
            Request::Write {
                key: 7,
                epoch,
                seq: 1,
                value: 10,
                lease_ns: 100 * MS,
                keep_ns: 300 * MS,
                alias: None,
            },
        );
        assert!(matches!(written, Reply::Written { .. }), "{written:?}");
        // A renewal moves the state's end: 250 + 300 ms.
        let renewed = s.handle(
            50 * MS,
            A,
            Request::Renew {
                key: 7,
                epoch,
                lease_ns: 100 * MS,
                nonce: 1,
                keep_ns: 500 * MS,
                alias: None,
            },
        );
        assert!(matches!(renewed, Reply::Renewed { .. }), "{renewed:?}");
        // Before its end, the next holder migrates the state.
        assert!(matches!(
            acquire(&mut s, 549 * MS, B),
            Reply::Granted {
                value: Some(10),
                seq: 1,
                ..
            }
        ));
        assert_eq!(s.counters.timed_out, 0);
        // B lets it lapse without a word; A, past the state's end, starts afresh, with
        // the epoch raised and the sequence where it was (a late write of seq 1 is old).
        let Reply::Granted {
            epoch: e3,
            seq: 1,
            value: None,
            ..
        } = acquire(&mut s, 1000 * MS, A)
        else {
            panic!("a state past its end is granted as none");
        };
        assert_eq!(e3, epoch + 2);
        assert_eq!(s.counters.timed_out, 1);
        assert!(matches!(
            write(&mut s, 1001 * MS, A, e3, 1, 10),
            Reply::Written { seq: 1, .. }
        ));
        assert_eq!(s.record(&7).and_then(|r| r.value), None, "not applied");
    }
}
