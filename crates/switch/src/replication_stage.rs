//! The `replicated` guarantee's stage (docs/REPLICATION.md): a run's `[replication]`
//! section, checked into a plan, and the state stage each worker runs around its program,
//! a [`Replica`] and a link to the store.
//!
//! Before the program sees a burst, each packet of a replicated flow is admitted: a flow
//! whose lease this worker does not hold waits for it, and the store's state is installed
//! before its packets are processed. After the program, each flow whose state the burst
//! changed is written (one write a flow, however many of its packets changed it), and
//! every output waits until the writes it depends on are acknowledged; an output that
//! cannot be (its flow's lease lost, the store out of reach past `park_timeout_ms`) is
//! dropped as `unreplicated`.
//!
//! The burst waits for its round trips to the store, in order, so an offline run keeps its
//! output order; a live port cannot wait so, and holding packets across bursts (where a
//! live worker goes on with others) is not built yet: replicated state on interfaces is
//! refused.
//!
//! Must never: let an output leave before the store has the state it reflects; process a
//! packet of a flow whose lease this worker does not hold; wait for ever.

use serde::Deserialize;
use stateplane_replication::FlowBytes;
use stateplane_replication::replica::{Admit, Event, Release, Replica, ReplicaConfig, Token};
use stateplane_replication::store::StoreConfig;
use stateplane_replication::{Holder, Reply, Request};
use stateplane_runtime::{
    Burst, Context, DropReason, Running, StateStage, StateStageFactory, Verdict,
};
use stateplane_stores::memory::MemoryStore;
use stateplane_stores::redis::{RedisConfig, RedisStore};
use stateplane_stores::{LinkCounters, StoreLink, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A run's `[replication]` section.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReplicationSettings {
    /// "memory" (the default: a store in this process) or a Redis URL.
    pub store: Option<String>,
    /// "linearizable" (the default); "bounded" is not built yet.
    pub mode: Option<String>,
    /// The lease of a flow, in milliseconds (100 to 60,000; 1,000 by default).
    pub lease_ms: Option<u64>,
    /// This switch's id among those sharing the store (1 to 16,777,215; 1 by default).
    pub switch: Option<u32>,
    /// Redis: `store` is a node of a Redis Cluster (each flow's calls go to its slot's
    /// master).
    pub cluster: Option<bool>,
    /// Redis: a write is acknowledged once this many replicas have it (`WAIT`), within
    /// `wait_ms` (100 by default).
    pub wait_replicas: Option<u32>,
    pub wait_ms: Option<u64>,
    /// Packets a worker holds at most while they wait (65,536 by default).
    pub park_limit: Option<usize>,
    /// How long a packet may wait for its flow's lease or its output for the store
    /// (milliseconds; 2,000 by default).
    pub park_timeout_ms: Option<u64>,
    /// An unanswered request is sent again after this long (milliseconds; 20 by default).
    pub retransmit_ms: Option<u64>,
    /// Each packet of a replicated flow, its input and output with call and return times,
    /// written to this file as JSON lines (docs/REPLICATION.md, *Histories*); `--history`.
    pub history: Option<std::path::PathBuf>,
}

fn within(field: &str, value: u64, lo: u64, hi: u64) -> Result<u64, String> {
    if (lo..=hi).contains(&value) {
        Ok(value)
    } else {
        Err(format!(
            "replication.{field}: {value} is outside {lo} to {hi}"
        ))
    }
}

#[derive(Clone)]
enum Store {
    Memory(Arc<MemoryStore<FlowBytes>>),
    Redis(Arc<RedisStore>),
}

/// What the replication stages of a run did, summed over workers.
#[derive(Debug, Default)]
pub struct ReplicationCounters {
    pub processed: AtomicU64,
    pub waited_for_lease: AtomicU64,
    pub waited_for_store: AtomicU64,
    pub dropped: AtomicU64,
    pub writes: AtomicU64,
    pub coalesced: AtomicU64,
    pub acquires: AtomicU64,
    pub renewals: AtomicU64,
    pub retransmits: AtomicU64,
    pub migrated: AtomicU64,
    pub waited: AtomicU64,
    pub fenced: AtomicU64,
    pub install_refused: AtomicU64,
    pub round_trips: AtomicU64,
    pub store_errors: AtomicU64,
    pub reconnects: AtomicU64,
}

/// A checked `[replication]` section, ready to make each worker's stage.
#[derive(Clone)]
pub struct ReplicationPlan {
    store: Store,
    store_name: String,
    replica: ReplicaConfig,
    switch: u32,
    incarnation: u32,
    history: Option<Arc<Mutex<History>>>,
    pub counters: Arc<ReplicationCounters>,
}

/// Where a run's history goes: one file for every worker's lines, a burst's lines at a
/// time.
struct History {
    file: std::io::BufWriter<std::fs::File>,
    path: std::path::PathBuf,
    failed: bool,
}

impl History {
    /// Writes `lines` and flushes them to the file (a process killed after this has them
    /// on record); a failure is logged once and ends the history, not the run.
    fn write(&mut self, lines: &str) {
        use std::io::Write as _;
        if self.failed || lines.is_empty() {
            return;
        }
        if let Err(e) = self
            .file
            .write_all(lines.as_bytes())
            .and_then(|()| self.file.flush())
        {
            log::warn!(
                "replication.history {}: {e}; the history stops here",
                self.path.display()
            );
            self.failed = true;
        }
    }
}

/// Nanoseconds since the Unix epoch: a history's times, comparable between processes.
fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

impl ReplicationSettings {
    /// Checks the section (errors name the key and the fix) and connects to the store, so
    /// that a store out of reach is refused before the run starts.
    pub fn plan(&self, live: bool) -> Result<ReplicationPlan, String> {
        if live {
            return Err(
                "guarantees: replicated state on interfaces is not built yet (a live \
                        worker cannot wait for the store with its burst, and holding packets \
                        across bursts is still to come); replicated state runs over capture \
                        files today"
                    .into(),
            );
        }
        match self.mode.as_deref() {
            None | Some("linearizable") => {}
            Some("bounded") => {
                return Err(
                    "replication.mode: 'bounded' (periodic snapshots) is not built yet; \
                            use 'linearizable'"
                        .into(),
                );
            }
            Some(other) => {
                return Err(format!(
                    "replication.mode: '{other}' is not a mode; use 'linearizable'"
                ));
            }
        }
        let lease_ms = within("lease_ms", self.lease_ms.unwrap_or(1_000), 100, 60_000)?;
        let switch = within("switch", u64::from(self.switch.unwrap_or(1)), 1, 0xff_ffff)? as u32;
        let park_limit = within(
            "park_limit",
            self.park_limit.unwrap_or(65_536) as u64,
            1,
            1 << 24,
        )? as usize;
        let park_timeout_ms = within(
            "park_timeout_ms",
            self.park_timeout_ms.unwrap_or(2_000),
            1,
            600_000,
        )?;
        let retransmit_ms = within("retransmit_ms", self.retransmit_ms.unwrap_or(20), 1, 10_000)?;
        let ms = |m: u64| m * 1_000_000;
        let replica = ReplicaConfig {
            lease_ns: ms(lease_ms),
            // Clocks drift by well under 1% over a lease.
            margin_ns: ms(lease_ms).div_ceil(100),
            retransmit_ns: ms(retransmit_ms),
            park_limit,
            park_timeout_ns: ms(park_timeout_ms),
        };
        let (store, store_name) = match self.store.as_deref() {
            None | Some("memory") => {
                if self.wait_replicas.is_some() || self.wait_ms.is_some() {
                    return Err(
                        "replication.wait_replicas: the memory store has no replicas to wait \
                                for; name a Redis store, or leave wait_replicas and wait_ms out"
                            .into(),
                    );
                }
                if self.cluster.is_some() {
                    return Err(
                        "replication.cluster: the memory store is no cluster; name a \
                                node of a Redis Cluster in `store`, or leave it out"
                            .into(),
                    );
                }
                let config = StoreConfig {
                    min_lease_ns: ms(100),
                    max_lease_ns: ms(60_000),
                    fencing: true,
                };
                (
                    Store::Memory(Arc::new(MemoryStore::new(config))),
                    "memory".to_string(),
                )
            }
            Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => {
                let mut config = RedisConfig::new(url);
                config.cluster = self.cluster.unwrap_or(false);
                if let Some(n) = self.wait_replicas {
                    let n = within("wait_replicas", u64::from(n), 1, 64)? as u32;
                    let wait_ms = within("wait_ms", self.wait_ms.unwrap_or(100), 1, 60_000)?;
                    config.wait = Some((n, Duration::from_millis(wait_ms)));
                } else if self.wait_ms.is_some() {
                    return Err(
                        "replication.wait_ms: it bounds the wait for `wait_replicas` \
                                replicas; give wait_replicas too, or leave wait_ms out"
                            .into(),
                    );
                }
                let redis =
                    RedisStore::connect(config).map_err(|e| format!("replication.store: {e}"))?;
                (Store::Redis(Arc::new(redis)), url.to_string())
            }
            Some(other) => {
                return Err(format!(
                    "replication.store: '{other}' is not a store; use \"memory\" or a Redis URL \
                     (\"redis://127.0.0.1:6379/\")"
                ));
            }
        };
        // A new incarnation each start, so that the writes a former run left on their way
        // are fenced (docs/REPLICATION.md).
        let incarnation = (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()) << 32) as u32;
        let history = match &self.history {
            None => None,
            Some(path) => {
                let file = std::fs::File::create(path)
                    .map_err(|e| format!("replication.history {}: {e}", path.display()))?;
                Some(Arc::new(Mutex::new(History {
                    file: std::io::BufWriter::new(file),
                    path: path.clone(),
                    failed: false,
                })))
            }
        };
        Ok(ReplicationPlan {
            store,
            store_name,
            replica,
            switch,
            incarnation,
            history,
            counters: Arc::default(),
        })
    }
}

impl ReplicationPlan {
    /// Each worker's stage: a replica of its own (worker `w` is holder `switch << 8 | w`)
    /// and its own link to the store.
    pub fn factory(&self) -> Result<StateStageFactory, String> {
        let plan = self.clone();
        // A link is made here first, so that a store the workers cannot reach is refused now.
        plan.link()?;
        Ok(Arc::new(move |w| {
            let holder = Holder {
                switch: plan.switch << 8 | (w as u32 & 0xff),
                incarnation: plan.incarnation,
            };
            let link = plan.link().unwrap_or_else(|e| {
                log::warn!("replication: worker {w}: {e}; its flows wait for the store");
                Box::new(Unreachable)
            });
            Box::new(ReplicationStage {
                replica: Replica::new(holder, plan.replica),
                config: plan.replica,
                link,
                epoch: Instant::now(),
                counters: Arc::clone(&plan.counters),
                published: (Default::default(), LinkCounters::default()),
                next_token: 0,
                tokens: Vec::new(),
                flows: Vec::new(),
                index_of_flow: HashMap::new(),
                waiting: HashSet::new(),
                index_of_token: HashMap::new(),
                dropped: HashSet::new(),
                requests: Vec::new(),
                replies: Vec::new(),
                history: plan.history.clone(),
                lines: String::new(),
            }) as Box<dyn StateStage>
        }))
    }

    fn link(&self) -> Result<Box<dyn StoreLink<FlowBytes>>, String> {
        Ok(match &self.store {
            Store::Memory(m) => Box::new(m.link()),
            Store::Redis(r) => Box::new(r.link::<FlowBytes>()?),
        })
    }

    pub fn report(&self) -> ReplicationReport {
        let c = &*self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ReplicationReport {
            store: self.store_name.clone(),
            processed: get(&c.processed),
            waited_for_lease: get(&c.waited_for_lease),
            waited_for_store: get(&c.waited_for_store),
            dropped: get(&c.dropped),
            writes: get(&c.writes),
            coalesced: get(&c.coalesced),
            acquires: get(&c.acquires),
            renewals: get(&c.renewals),
            retransmits: get(&c.retransmits),
            migrated: get(&c.migrated),
            waited: get(&c.waited),
            fenced: get(&c.fenced),
            install_refused: get(&c.install_refused),
            round_trips: get(&c.round_trips),
            store_errors: get(&c.store_errors),
            reconnects: get(&c.reconnects),
        }
    }
}

/// A link to a store the worker could not reach when it started: nothing is answered,
/// so its replicated flows' packets wait, then are dropped (counted).
struct Unreachable;

impl StoreLink<FlowBytes> for Unreachable {
    fn send(&mut self, _holder: Holder, requests: &mut Vec<Request<FlowBytes, Value>>) {
        requests.clear();
    }
    fn receive(&mut self, _out: &mut Vec<Reply<FlowBytes, Value>>) {}
    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    fn counters(&self) -> LinkCounters {
        LinkCounters {
            errors: 1,
            ..LinkCounters::default()
        }
    }
}

/// What the replication stages did, for the run's summary.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplicationReport {
    pub store: String,
    pub processed: u64,
    pub waited_for_lease: u64,
    pub waited_for_store: u64,
    pub dropped: u64,
    pub writes: u64,
    pub coalesced: u64,
    pub acquires: u64,
    pub renewals: u64,
    pub retransmits: u64,
    pub migrated: u64,
    pub waited: u64,
    pub fenced: u64,
    pub install_refused: u64,
    pub round_trips: u64,
    pub store_errors: u64,
    pub reconnects: u64,
}

impl ReplicationReport {
    pub fn table(&self) -> String {
        format!(
            "replication to {}:\n  packets {}  waited for a lease {}  for the store {}  \
             dropped unreplicated {}\n  writes {} (changes folded in {})  leases asked {} \
             (with state {}, after another's {})  renewed {}  fenced {}  sent again {}\n  \
             round trips {}  store errors {}  reconnects {}  states refused {}\n",
            self.store,
            self.processed,
            self.waited_for_lease,
            self.waited_for_store,
            self.dropped,
            self.writes,
            self.coalesced,
            self.acquires,
            self.migrated,
            self.waited,
            self.renewals,
            self.fenced,
            self.retransmits,
            self.round_trips,
            self.store_errors,
            self.reconnects,
            self.install_refused,
        )
    }
}

struct ReplicationStage {
    replica: Replica<FlowBytes, Value>,
    config: ReplicaConfig,
    link: Box<dyn StoreLink<FlowBytes>>,
    /// The stage's clock: leases are real time, whatever the packets' timestamps say.
    epoch: Instant,
    counters: Arc<ReplicationCounters>,
    /// What was added to `counters` so far (the replica's and the link's counts).
    published: (
        stateplane_replication::replica::ReplicaCounters,
        LinkCounters,
    ),
    next_token: Token,
    /// Per packet of the burst: its flow and token (`None`: no replicated state).
    tokens: Vec<Option<(FlowBytes, Token)>>,
    /// The burst's flows, each with its state before the program.
    flows: Vec<(FlowBytes, Option<Value>)>,
    index_of_flow: HashMap<FlowBytes, usize>,
    /// Tokens waiting, and those dropped (with why).
    waiting: HashSet<Token>,
    /// Where each token whose output waited or was dropped sits in the burst.
    index_of_token: HashMap<Token, usize>,
    dropped: HashSet<Token>,
    requests: Vec<Request<FlowBytes, Value>>,
    replies: Vec<Reply<FlowBytes, Value>>,
    history: Option<Arc<Mutex<History>>>,
    /// History lines not yet written.
    lines: String,
}

impl ReplicationStage {
    /// The history's name of a packet: its holder and token, unique across processes.
    fn op(&self, token: Token) -> String {
        let h = self.replica.holder();
        format!("{}:{}:{token}", h.switch, h.incarnation)
    }

    /// Writes the lines gathered (before the burst's writes go to the store, so that a
    /// packet's call is on record before anything it did can be).
    fn write_history(&mut self) {
        if let Some(h) = &self.history {
            h.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .write(&self.lines);
        }
        self.lines.clear();
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// One exchange with the store: what is due goes, what came is handled, and the
    /// replica's events are applied to the program and to the waiting packets.
    fn pump(&mut self, program: &mut dyn Running, ctx: &Context) {
        let now = self.now();
        if self.replica.poll_timeout().is_some_and(|t| t <= now) {
            self.replica.handle_timeout(now);
        }
        self.replica.poll_transmit(now, &mut self.requests);
        let holder = self.replica.holder();
        self.link.send(holder, &mut self.requests);
        self.link.receive(&mut self.replies);
        for reply in self.replies.drain(..) {
            self.replica.handle_reply(now, reply);
        }
        // Answers may make more to send (a flow's next write): sent at the next exchange.
        while let Some(event) = self.replica.poll_event() {
            match event {
                Event::Install { key, value, .. } => {
                    let state = value.as_deref().filter(|v| !v.is_empty());
                    if !program.install_replicated(&key, state, ctx.now_ns) {
                        self.counters
                            .install_refused
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
                Event::Forget { key } => {
                    program.install_replicated(&key, None, ctx.now_ns);
                }
                Event::Process { token, .. } | Event::Release { token, .. } => {
                    self.waiting.remove(&token);
                }
                Event::Drop { token, .. } => {
                    self.waiting.remove(&token);
                    self.dropped.insert(token);
                }
            }
        }
    }

    /// Exchanges with the store until no packet of the burst waits, at most a little
    /// past the park timeout (the replica drops what waits that long).
    fn wait(&mut self, program: &mut dyn Running, ctx: &Context) {
        let limit = Duration::from_nanos(self.config.park_timeout_ns) + Duration::from_secs(1);
        let start = Instant::now();
        loop {
            self.pump(program, ctx);
            if self.waiting.is_empty() {
                return;
            }
            if start.elapsed() > limit {
                for token in self.waiting.drain() {
                    self.dropped.insert(token);
                }
                return;
            }
            // The memory store answers at once; Redis within a round trip (tens of µs).
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// The return lines of the burst's outputs that leave: each with its verdict and bytes,
    /// and, for a flow's last packet of the burst, the flow's state after it (the state
    /// the burst's write carried; a flow's earlier packets' states were never kept).
    fn history_returns(&mut self, burst: &Burst, program: &mut dyn Running) {
        let return_ns = wall_ns();
        let mut last_of_flow = HashMap::new();
        for (i, slot) in self.tokens.iter().enumerate() {
            if let Some((key, _)) = slot {
                last_of_flow.insert(*key, i);
            }
        }
        for (i, slot) in self.tokens.iter().enumerate() {
            let Some((key, token)) = slot else { continue };
            if self.dropped.contains(token) {
                continue; // its output never leaves: no return
            }
            let d = &burst.descs()[i];
            let state = if last_of_flow.get(key) == Some(&i) {
                match program.replicated_state(key) {
                    Some(s) => format!("\"{}\"", hex(&s)),
                    None => "\"\"".to_string(),
                }
            } else {
                "null".to_string()
            };
            self.lines.push_str(&format!(
                "{{\"op\":\"{}\",\"return_ns\":{return_ns},\"verdict\":\"{:?}\",\"output\":\"{}\",\"state\":{state}}}\n",
                self.op(*token),
                d.verdict,
                hex(burst.data(i)),
            ));
        }
        self.write_history();
    }

    fn publish(&mut self) {
        let (r, l) = (self.replica.counters, self.link.counters());
        let (pr, pl) = &self.published;
        let c = &*self.counters;
        let add = |a: &AtomicU64, now: u64, then: u64| {
            a.fetch_add(now.saturating_sub(then), Ordering::Relaxed);
        };
        add(&c.writes, r.writes, pr.writes);
        add(&c.coalesced, r.coalesced, pr.coalesced);
        add(&c.acquires, r.acquires, pr.acquires);
        add(&c.renewals, r.renewals, pr.renewals);
        add(&c.retransmits, r.retransmits, pr.retransmits);
        add(&c.migrated, r.migrated, pr.migrated);
        add(&c.waited, r.waited, pr.waited);
        add(&c.fenced, r.fenced, pr.fenced);
        add(&c.round_trips, l.round_trips, pl.round_trips);
        add(&c.store_errors, l.errors, pl.errors);
        add(&c.reconnects, l.reconnects, pl.reconnects);
        self.published = (r, l);
    }
}

impl StateStage for ReplicationStage {
    fn before_program(&mut self, burst: &mut Burst, program: &mut dyn Running, ctx: &Context) {
        self.pump(program, ctx);
        let now = self.now();
        self.tokens.clear();
        self.dropped.clear();
        for d in burst.descs() {
            let Some(key) = program.replicated_key(d) else {
                self.tokens.push(None);
                continue;
            };
            let token = self.next_token;
            self.next_token += 1;
            match self.replica.admit(now, key, token) {
                Admit::Process => {}
                Admit::Parked => {
                    self.waiting.insert(token);
                    self.counters
                        .waited_for_lease
                        .fetch_add(1, Ordering::Relaxed);
                }
                Admit::Dropped(_) => {
                    self.dropped.insert(token);
                }
            }
            self.tokens.push(Some((key, token)));
        }
        if !self.waiting.is_empty() {
            self.wait(program, ctx);
        }
        // A lease that passed while the burst waited for another flow's: the packet is
        // not processed (it would be without a lease).
        let now = self.now();
        for (key, token) in self.tokens.iter().flatten() {
            if !self.dropped.contains(token) && !self.replica.holds(key, now) {
                self.dropped.insert(*token);
            }
        }
        // Packets not to be processed leave the burst, counted.
        if self.history.is_some() {
            let call_ns = wall_ns();
            for (i, slot) in self.tokens.iter().enumerate() {
                let Some((key, token)) = slot else { continue };
                let d = &burst.descs()[i];
                let line = if self.dropped.contains(token) {
                    format!(
                        "{{\"op\":\"{}\",\"flow\":\"{key:?}\",\"void\":true}}\n",
                        self.op(*token)
                    )
                } else {
                    format!(
                        "{{\"op\":\"{}\",\"flow\":\"{key:?}\",\"call_ns\":{call_ns},\"len\":{},\"input\":\"{}\"}}\n",
                        self.op(*token),
                        d.orig_len,
                        hex(burst.data(i)),
                    )
                };
                self.lines.push_str(&line);
            }
        }
        let mut i = 0;
        let (tokens, dropped) = (&self.tokens, &self.dropped);
        let mut removed = 0u64;
        burst.retain(|_| {
            let keep = !matches!(tokens[i], Some((_, t)) if dropped.contains(&t));
            i += 1;
            removed += u64::from(!keep);
            keep
        });
        self.tokens
            .retain(|t| !matches!(t, Some((_, t)) if dropped.contains(t)));
        self.counters.dropped.fetch_add(removed, Ordering::Relaxed);
        // Each flow's state before the program, to see what the burst changed.
        self.flows.clear();
        self.index_of_flow.clear();
        for (key, _) in self.tokens.iter().flatten() {
            if !self.index_of_flow.contains_key(key) {
                self.index_of_flow.insert(*key, self.flows.len());
                self.flows.push((*key, program.replicated_state(key)));
            }
        }
    }

    fn after_program(&mut self, burst: &mut Burst, program: &mut dyn Running, ctx: &Context) {
        if self.flows.is_empty() {
            return;
        }
        self.write_history();
        let now = self.now();
        // Each flow's change: its state after the burst, if it differs (written once).
        let mut change: Vec<Option<Value>> = (self.flows.iter())
            .map(|(key, before)| {
                let after = program.replicated_state(key);
                (after != *before).then(|| after.unwrap_or_default())
            })
            .collect();
        let changed: Vec<bool> = change.iter().map(Option::is_some).collect();
        let (mut processed, mut folded) = (0u64, 0u64);
        self.index_of_token.clear();
        for (i, slot) in self.tokens.iter().enumerate() {
            let Some((key, token)) = slot else { continue };
            processed += 1;
            let flow = self.index_of_flow[key];
            // The flow's change goes with its first packet; the others' fold into it.
            let write = change[flow].take();
            folded += u64::from(write.is_none() && changed[flow]);
            match self.replica.processed(now, *key, *token, write) {
                Release::Now => {}
                Release::Parked => {
                    self.waiting.insert(*token);
                    self.index_of_token.insert(*token, i);
                    self.counters
                        .waited_for_store
                        .fetch_add(1, Ordering::Relaxed);
                }
                Release::Dropped(_) => {
                    self.dropped.insert(*token);
                    self.index_of_token.insert(*token, i);
                }
            }
        }
        self.counters
            .processed
            .fetch_add(processed, Ordering::Relaxed);
        self.counters.coalesced.fetch_add(folded, Ordering::Relaxed);
        if !self.waiting.is_empty() {
            self.wait(program, ctx);
        }
        let descs = burst.descs_mut();
        let mut dropped = 0;
        for token in &self.dropped {
            if let Some(&i) = self.index_of_token.get(token)
                && let Some(d) = descs.get_mut(i)
            {
                d.verdict = Verdict::Drop(DropReason::UNREPLICATED);
                dropped += 1;
            }
        }
        self.counters.dropped.fetch_add(dropped, Ordering::Relaxed);
        if self.history.is_some() {
            self.history_returns(burst, program);
        }
        self.dropped.clear();
        // The flows' next writes (made by answers just taken) go now, not at the next burst.
        self.pump(program, ctx);
        self.publish();
    }

    fn after_burst(&mut self, _program: &mut dyn Running, _ctx: &Context) {}

    fn tick(&mut self, program: &mut dyn Running, ctx: &Context) {
        self.pump(program, ctx);
        self.publish();
    }

    /// The new instance holds no flow's state: the replica starts over as the same holder,
    /// so each flow's next packet is granted its lease again with the store's state.
    fn reloaded(&mut self, _program: &mut dyn Running, _ctx: &Context) {
        self.replica = Replica::new(self.replica.holder(), self.config);
    }

    fn finish(&mut self, program: &mut dyn Running, ctx: &Context) {
        self.pump(program, ctx);
        self.publish();
        self.write_history();
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        self.link.wake_fd()
    }
}
