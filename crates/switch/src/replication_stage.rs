//! The `replicated` guarantee's stage (docs/REPLICATION.md): a run's `[replication]`
//! section, checked into a plan, and the state stage each worker runs around its program,
//! a [`Replica`] and a link to the store.
//!
//! Before the program sees a burst, each packet of a replicated flow is admitted: a flow
//! whose lease this worker does not hold waits for it, and the store's state is installed
//! before its packets are processed. After the program, each flow whose state differs from
//! the latest the replica knows (the store's, or a write on its way) is written (one write
//! a flow, however many of its packets changed it), and
//! every output waits until the writes it depends on are acknowledged; an output that
//! cannot be (its flow's lease lost, the store out of reach past `park_timeout_ms`) is
//! dropped as `unreplicated`.
//!
//! The worker never waits for the store: a packet that must wait (for its flow's lease,
//! or its output for the write's answer) is held across bursts ([`Held`]) and put back
//! into a later one in its flow's order, on capture files and on interfaces alike.
//!
//! Must never: let an output leave before the store has the state it reflects; process a
//! packet of a flow whose lease this worker does not hold; wait for ever.

use crate::snapshot_stage::{OnStale, SnapshotSettings, SnapshotStage};
use serde::Deserialize;
use stateplane_programs::ReplicationMode;
use stateplane_replication::FlowBytes;
use stateplane_replication::replica::{
    Admit, DropReason as ReplicaDrop, Event, Places, Release, Replica, ReplicaConfig, Token,
};
use stateplane_replication::snapshot::{SnapshotConfig, Snapshots};
use stateplane_replication::store::StoreConfig;
use stateplane_replication::{FlowMap, Holder, Reply, Request};
use stateplane_runtime::{
    Burst, Context, DropReason, Held, HeldPacket, LeasedPacket, PacketDesc, Running, StateStage,
    StateStageFactory, Verdict,
};
use stateplane_stores::memory::MemoryStore;
use stateplane_stores::redis::{RedisConfig, RedisStore};
use stateplane_stores::redis_client::{self, RedisTls, TlsFiles};
use stateplane_stores::{LinkCounters, StoreLink, Value};
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A run's `[replication]` section.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReplicationSettings {
    /// "memory" (the default: a store in this process) or a Redis URL.
    pub store: Option<String>,
    /// "linearizable" (the default), or "bounded": periodic snapshots (a count-min sketch).
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
    /// Redis over TLS (a `rediss://` store): the certificate (PEM) of the CA that signed
    /// the server's (without it, the system's roots), and this switch's certificate and
    /// key (PEM) for a server that asks its clients for one (`tls-auth-clients`).
    pub tls_ca: Option<std::path::PathBuf>,
    pub tls_cert: Option<std::path::PathBuf>,
    pub tls_key: Option<std::path::PathBuf>,
    /// Packets a worker holds at most while they wait (65,536 by default).
    pub park_limit: Option<usize>,
    /// How long a packet may wait for its flow's lease or its output for the store
    /// (milliseconds; 2,000 by default).
    pub park_timeout_ms: Option<u64>,
    /// An unanswered request is sent again after at least this long, longer as the store
    /// answers slower (milliseconds; 20 by default).
    pub retransmit_ms: Option<u64>,
    /// Bounded mode: a snapshot every this many milliseconds (1 to 60,000; 100 by default).
    pub snapshot_ms: Option<u64>,
    /// Bounded mode: the staleness bound ε, in milliseconds (at least `snapshot_ms`; ten
    /// snapshots' time by default).
    pub staleness_ms: Option<u64>,
    /// Bounded mode: past the bound, "report" (the default), "drop" or "stop".
    pub on_stale: Option<String>,
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
    /// Fenced writes written under the lease taken again, nobody having written since.
    pub retaken: AtomicU64,
    pub install_refused: AtomicU64,
    /// Aliases asked of the store (packets that named their flow only so), and those that
    /// named a flow.
    pub resolves: AtomicU64,
    pub resolved: AtomicU64,
    pub round_trips: AtomicU64,
    pub store_errors: AtomicU64,
    pub reconnects: AtomicU64,
    /// Requests sent again while the same was still on its way to the store: not sent
    /// twice (`LinkCounters::repeats_held`).
    pub repeats_held: AtomicU64,
    /// Packets held across bursts now (summed over workers), and the most one worker held.
    pub held: AtomicU64,
    pub held_most: AtomicU64,
    /// Bounded mode: snapshots the store acknowledged, their bytes, images installed from
    /// the store, packets processed while the store's snapshot was past the bound, and
    /// the most staleness seen.
    pub snapshots: AtomicU64,
    pub snapshot_bytes: AtomicU64,
    pub installed: AtomicU64,
    pub stale: AtomicU64,
    pub staleness_most_ns: AtomicU64,
}

/// Adds to a run's counter what a stage's own count gained since it last published
/// (`then`); nothing, not even an atomic add, when it gained nothing (most bursts).
pub(crate) fn add_since(counter: &AtomicU64, now: u64, then: u64) {
    if now > then {
        counter.fetch_add(now - then, Ordering::Relaxed);
    }
}

impl ReplicationCounters {
    /// Adds what a stage's link did since it last published (`then`), and moves the held
    /// gauge from what it held then to what it holds now (`now`: link counters, packets
    /// held, the most held at once).
    pub(crate) fn publish_link_and_held(
        &self,
        (l, held, most): (LinkCounters, usize, usize),
        (pl, pheld): (LinkCounters, usize),
    ) {
        let add = add_since;
        add(&self.round_trips, l.round_trips, pl.round_trips);
        add(&self.store_errors, l.errors, pl.errors);
        add(&self.reconnects, l.reconnects, pl.reconnects);
        add(&self.repeats_held, l.repeats_held, pl.repeats_held);
        // A gauge summed over workers: each adds what it holds now less what it held (the
        // most held grows only as the held do).
        if held != pheld {
            self.held
                .fetch_add((held as u64).wrapping_sub(pheld as u64), Ordering::Relaxed);
            self.held_most.fetch_max(most as u64, Ordering::Relaxed);
        }
    }
}

/// A checked `[replication]` section, ready to make each worker's stage.
#[derive(Clone)]
pub struct ReplicationPlan {
    store: Store,
    store_name: String,
    /// Bounded mode's settings (`None`: linearizable).
    bounded: Option<SnapshotSettings>,
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
    /// The TLS files of a Redis store, each with its setting's name.
    fn tls_files(&self) -> TlsFiles<'_> {
        TlsFiles {
            ca: (self.tls_ca.as_deref()).map(|p| ("replication.tls_ca", p)),
            cert: (self.tls_cert.as_deref()).map(|p| ("replication.tls_cert", p)),
            key: (self.tls_key.as_deref()).map(|p| ("replication.tls_key", p)),
        }
    }

    /// Checks the section (errors name the key and the fix) and connects to the store, so
    /// that a store out of reach is refused before the run starts.
    /// The section's `mode`.
    pub fn mode(&self) -> Result<ReplicationMode, String> {
        match self.mode.as_deref() {
            None | Some("linearizable") => Ok(ReplicationMode::Linearizable),
            Some("bounded") => Ok(ReplicationMode::Bounded),
            Some(other) => Err(format!(
                "replication.mode: '{other}' is not a mode; use 'linearizable' (each change \
                 acknowledged before its packet leaves) or 'bounded' (periodic snapshots)"
            )),
        }
    }

    pub fn plan(&self) -> Result<ReplicationPlan, String> {
        let bounded = match self.mode()? {
            ReplicationMode::Bounded => {
                if self.history.is_some() {
                    return Err(
                        "replication.history: histories record the packets of flows \
                                replicated in linearizable mode; bounded mode has none: leave \
                                --history out"
                            .into(),
                    );
                }
                let snapshot_ms =
                    within("snapshot_ms", self.snapshot_ms.unwrap_or(100), 1, 60_000)?;
                let staleness_ms = self.staleness_ms.unwrap_or(10 * snapshot_ms);
                if staleness_ms < snapshot_ms {
                    return Err(format!(
                        "replication.staleness_ms: {staleness_ms} is below snapshot_ms \
                         ({snapshot_ms}): the store's state is a snapshot's time old between \
                         two; give at least {snapshot_ms}"
                    ));
                }
                let staleness_ms = within("staleness_ms", staleness_ms, 1, 3_600_000)?;
                let on_stale = OnStale::parse(self.on_stale.as_deref().unwrap_or("report"))?;
                Some((snapshot_ms, staleness_ms, on_stale))
            }
            ReplicationMode::Linearizable => {
                for (set, key) in [
                    (self.snapshot_ms.is_some(), "snapshot_ms"),
                    (self.staleness_ms.is_some(), "staleness_ms"),
                    (self.on_stale.is_some(), "on_stale"),
                ] {
                    if set {
                        return Err(format!(
                            "replication.{key}: it sets bounded mode's snapshots, and the mode \
                             is linearizable; set mode = \"bounded\", or leave {key} out"
                        ));
                    }
                }
                None
            }
        };
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
            ..ReplicaConfig::default()
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
                if let Some(setting) = self.tls_files().first_given() {
                    return Err(format!(
                        "{setting}: the memory store is in this process, with no connection \
                         to guard; name a rediss:// store, or leave {setting} out"
                    ));
                }
                let config = StoreConfig {
                    min_lease_ns: ms(100),
                    max_lease_ns: ms(60_000),
                    fencing: true,
                    ..StoreConfig::default()
                };
                (
                    Store::Memory(Arc::new(MemoryStore::new(config))),
                    "memory".to_string(),
                )
            }
            Some(url)
                if [
                    "redis://",
                    "rediss://",
                    "redis+sentinel://",
                    "rediss+sentinel://",
                ]
                .iter()
                .any(|scheme| url.starts_with(scheme)) =>
            {
                let mut config = RedisConfig::new(url);
                config.cluster = self.cluster.unwrap_or(false);
                config.tls = RedisTls::load(url, "replication.store", self.tls_files())?;
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
                (Store::Redis(Arc::new(redis)), redis_client::redacted(url))
            }
            Some(other) => {
                return Err(format!(
                    "replication.store: '{other}' is not a store; use \"memory\" or a Redis URL \
                     (\"redis://127.0.0.1:6379/\"; rediss:// for TLS; \
                     redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER through Redis Sentinel)"
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
        let bounded = bounded.map(|(snapshot_ms, staleness_ms, on_stale)| SnapshotSettings {
            config: SnapshotConfig {
                period_ns: ms(snapshot_ms),
                bound_ns: ms(staleness_ms),
                lease_ns: replica.lease_ns,
                margin_ns: replica.margin_ns,
                retransmit_ns: replica.retransmit_ns,
            },
            on_stale,
            park_limit,
            park_timeout_ns: replica.park_timeout_ns,
        });
        Ok(ReplicationPlan {
            store,
            store_name,
            bounded,
            replica,
            switch,
            incarnation,
            history,
            counters: Arc::default(),
        })
    }
}

impl ReplicationPlan {
    /// The packets each worker may hold for their flows' writes (`replication.park_limit`).
    pub fn park_limit(&self) -> usize {
        self.replica.park_limit
    }

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
            if let Some(settings) = plan.bounded {
                return Box::new(SnapshotStage::new(
                    Snapshots::key_of(plan.switch, w),
                    holder,
                    settings,
                    link,
                    Arc::clone(&plan.counters),
                )) as Box<dyn StateStage>;
            }
            Box::new(ReplicationStage::new(
                Replica::new(holder, plan.replica),
                plan.replica,
                link,
                Arc::clone(&plan.counters),
                plan.history.clone(),
            )) as Box<dyn StateStage>
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
            mode: match self.bounded {
                Some(_) => "bounded",
                None => "linearizable",
            },
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
            retaken: get(&c.retaken),
            install_refused: get(&c.install_refused),
            resolves: get(&c.resolves),
            resolved: get(&c.resolved),
            round_trips: get(&c.round_trips),
            store_errors: get(&c.store_errors),
            reconnects: get(&c.reconnects),
            repeats_held: get(&c.repeats_held),
            held_most: get(&c.held_most),
            snapshots: get(&c.snapshots),
            snapshot_bytes: get(&c.snapshot_bytes),
            installed: get(&c.installed),
            stale: get(&c.stale),
            staleness_most_ms: get(&c.staleness_most_ns) as f64 / 1e6,
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
    /// "linearizable" or "bounded".
    pub mode: &'static str,
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
    /// Fenced writes written under the lease taken again (a store or link gone longer
    /// than the lease, nobody having written the flow since): none of their outputs lost.
    pub retaken: u64,
    pub install_refused: u64,
    /// Aliases asked of the store, and those that named a flow.
    pub resolves: u64,
    pub resolved: u64,
    pub round_trips: u64,
    pub store_errors: u64,
    pub reconnects: u64,
    /// Requests sent again not sent twice: the first was still on its way.
    pub repeats_held: u64,
    /// The most packets one worker held across bursts at once.
    pub held_most: u64,
    /// Bounded mode: snapshots the store acknowledged and their bytes, images installed
    /// from the store, packets processed while stale, and the most staleness seen.
    pub snapshots: u64,
    pub snapshot_bytes: u64,
    pub installed: u64,
    pub stale: u64,
    pub staleness_most_ms: f64,
}

impl ReplicationReport {
    pub fn table(&self) -> String {
        if self.mode == "bounded" {
            return format!(
                "replication to {} (bounded):\n  packets {}  held for the store's image {}  \
                 dropped unreplicated {}\n  snapshots written {} ({} bytes, {} begun)  \
                 images installed {}  staleness at most {:.1} ms  packets while stale {}\n  \
                 leases asked {}  renewed {}  fenced {}  sent again {}  round trips {}  \
                 store errors {}  reconnects {}  images refused {}\n",
                self.store,
                self.processed,
                self.waited_for_lease,
                self.dropped,
                self.snapshots,
                self.snapshot_bytes,
                self.writes,
                self.installed,
                self.staleness_most_ms,
                self.stale,
                self.acquires,
                self.renewals,
                self.fenced,
                self.retransmits,
                self.round_trips,
                self.store_errors,
                self.reconnects,
                self.install_refused,
            );
        }
        format!(
            "replication to {}:\n  packets {}  waited for a lease {}  for the store {}  \
             dropped unreplicated {}\n  writes {} (changes folded in {})  leases asked {} \
             (with state {}, after another's {})  renewed {}  fenced {} (written after all {})  \
             sent again {} (of them still on their way {})\n  aliases asked {} (naming a flow {})  \
             round trips {}  store errors {}  reconnects {}  states refused {}  \
             packets held at most {}\n",
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
            self.retaken,
            self.retransmits,
            self.repeats_held,
            self.resolves,
            self.resolved,
            self.round_trips,
            self.store_errors,
            self.reconnects,
            self.install_refused,
            self.held_most,
        )
    }
}

/// Whether a stage's store has been out of reach, and since when: past the park timeout
/// a run over a capture stops waiting for it (what waits is dropped then anyway).
#[derive(Default)]
pub(crate) struct Reach {
    lost_since: Option<u64>,
}

impl Reach {
    /// The link seen `connected` or not at `now` (the stage's clock).
    pub(crate) fn saw(&mut self, connected: bool, now: u64) {
        self.lost_since = match connected {
            true => None,
            false => self.lost_since.or(Some(now)),
        };
    }

    /// Whether the store has been out of reach for `ns` or more at `now()` (the clock is
    /// read only while it is out of reach: a run asks after every burst).
    pub(crate) fn lost_for(&self, ns: u64, now: impl FnOnce() -> u64) -> bool {
        self.lost_since
            .is_some_and(|since| now().saturating_sub(since) >= ns)
    }
}

/// Keeps the burst's packets whose `keep` is true, in order (`keep` has one per packet).
fn retain_kept(burst: &mut Burst, keep: &[bool]) {
    let mut i = 0;
    burst.retain(|_| {
        i += 1;
        keep[i - 1]
    });
}

/// Packets waiting for the store past which a run from a capture waits for it: at a
/// Redis's 50,000 to 100,000 calls a second, 40 to 80 ms of its work queued.
const BACKLOG: usize = 4_096;

/// What the stage keeps of a packet it holds.
struct Hold {
    /// Its flow (while the store is asked which flow its alias names, the alias).
    key: FlowBytes,
    /// Named by an alias that names no flow at the store: processed as a packet of no
    /// replicated flow.
    alone: bool,
    /// Its verdict is final (processed, or dropped unprocessed): it waits to leave.
    processed: bool,
    /// For its return line: the flow's state after it, when it was its flow's last packet
    /// of its burst (`Some(None)`: no state).
    state: Option<Option<Value>>,
}

/// The replicated states of a burst's flows, encoded one after another into one buffer
/// kept across bursts, so that reading them costs no allocation a flow: flow `i`'s state
/// is `bytes[spans[i]]`, or none.
#[derive(Default)]
struct FlowStates {
    bytes: Vec<u8>,
    spans: Vec<Option<Span>>,
}

#[derive(Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
    /// When the state times out in the program (`u64::MAX`: never).
    deadline_ns: u64,
}

impl FlowStates {
    fn clear(&mut self) {
        self.bytes.clear();
        self.spans.clear();
    }

    /// Reads the next flow's state from the program (looking at `hint` first, made where
    /// it is now).
    fn push(&mut self, program: &dyn Running, key: &FlowBytes, hint: &mut u32) {
        let start = self.bytes.len();
        let deadline = program.replicated_state_into(key, &mut self.bytes, hint);
        self.spans.push(deadline.map(|deadline_ns| Span {
            start,
            end: self.bytes.len(),
            deadline_ns,
        }));
    }

    /// A flow whose state is not read: none.
    fn skip(&mut self) {
        self.spans.push(None);
    }

    fn get(&self, flow: usize) -> Option<&[u8]> {
        let span = self.spans.get(flow).copied().flatten()?;
        self.bytes.get(span.start..span.end)
    }

    /// When flow `flow`'s state times out, on the program's clock (`None`: no state).
    fn deadline_ns(&self, flow: usize) -> Option<u64> {
        Some(self.spans.get(flow).copied().flatten()?.deadline_ns)
    }
}

/// A flow of the burst at hand. Packets of one flow met at the same instant, with nothing
/// of their flow changed between them, get the same answers: the stage asks once a flow.
#[derive(Clone, Copy)]
struct BurstFlow {
    key: FlowBytes,
    /// A packet of it was let through at admission: the burst's later ones are too
    /// ([`Replica::admitted_again`]).
    go: bool,
    /// A packet of it is processed in this burst: its state after the program is read.
    processed: bool,
    /// Its state after the program was compared with the latest the replica knows (by
    /// its first packet processed), and found changed: the write goes with that packet.
    compared: bool,
    changed: bool,
    /// Outputs of it were held before this burst's were processed.
    outputs_held: bool,
    /// Where the replica keeps it, and where the program last had its state
    /// ([`Running::replicated_state_into`]; made where it has it now).
    places: Places,
}

impl BurstFlow {
    fn new(key: FlowBytes) -> BurstFlow {
        BurstFlow {
            key,
            go: false,
            processed: false,
            compared: false,
            changed: false,
            outputs_held: false,
            places: Places::NONE,
        }
    }
}

/// The burst's flows by key: an open-addressed table of places in the burst's list of
/// flows, kept at most half full and emptied each burst. It keeps no key of its own (a
/// map of keys copied each 64-byte key into it, and each burst's first packets of their
/// flows, most of a burst, are insertions).
#[derive(Default)]
struct FlowIndex {
    /// A flow's place plus one (0: empty), at its key's hash, or after it.
    places: Vec<u32>,
}

impl FlowIndex {
    /// Empties the index, with room for `flows` flows at most half full.
    fn clear(&mut self, flows: usize) {
        let size = (2 * flows.max(1)).next_power_of_two();
        if self.places.len() < size {
            self.places = vec![0; size];
        } else {
            self.places.fill(0);
        }
    }

    /// `key`'s place in `flows`, added there if it is not yet.
    fn find_or_add(&mut self, flows: &mut Vec<BurstFlow>, key: FlowBytes) -> usize {
        if 2 * (flows.len() + 1) > self.places.len() {
            // Grown: the places indexed so far (not every flow's: a packet named by an
            // alias has a place of its own, not indexed) are placed again.
            let old = std::mem::take(&mut self.places);
            self.clear(flows.len() + 1);
            for place in old.into_iter().filter(|&p| p > 0) {
                let at = self.slot_of(flows, &flows[place as usize - 1].key);
                self.places[at] = place;
            }
        }
        let at = self.slot_of(flows, &key);
        match self.places[at] {
            0 => {
                flows.push(BurstFlow::new(key));
                self.places[at] = flows.len() as u32;
                flows.len() - 1
            }
            place => place as usize - 1,
        }
    }

    /// `key`'s place in `flows`, if it is there.
    fn find(&self, flows: &[BurstFlow], key: &FlowBytes) -> Option<usize> {
        match self.places[self.slot_of(flows, key)] {
            0 => None,
            place => Some(place as usize - 1),
        }
    }

    /// Where `key` is, or the empty slot where it would go.
    fn slot_of(&self, flows: &[BurstFlow], key: &FlowBytes) -> usize {
        let mask = self.places.len() - 1;
        let mut at = key.hash_value() as usize & mask;
        loop {
            match self.places[at] {
                0 => return at,
                place if flows[place as usize - 1].key == *key => return at,
                _ => at = (at + 1) & mask,
            }
        }
    }
}

/// The packets of one flow the stage holds: those to be processed, those to leave.
#[derive(Default)]
struct Queue {
    inputs: u32,
    outputs: u32,
}

/// How many packets of flow `key` the stage holds (with none held at all, without a
/// lookup).
fn held_of<'a>(queues: &'a FlowMap<FlowBytes, Queue>, key: &FlowBytes) -> Option<&'a Queue> {
    match queues.is_empty() {
        true => None,
        false => queues.get(key),
    }
}

/// What becomes of a packet of the burst.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Processed in this burst; its output leaves with it.
    Go,
    /// Held unprocessed: its flow's lease is coming (or packets of its flow held before it
    /// are to be processed first, `ready`).
    HoldInput {
        ready: bool,
    },
    /// Processed; its output waits for the store.
    Parked,
    /// Processed; its output may leave (after any of its flow held before it).
    Released,
    Dropped,
}

struct Slot {
    token: Token,
    outcome: Outcome,
    /// Outputs of its flow were held when it was processed: its own goes behind them.
    behind: bool,
    /// Its flow's place among the burst's flows, where its key is (a packet named by an
    /// alias: a place of its own, its key the alias).
    flow: usize,
}

struct ReplicationStage {
    replica: Replica<FlowBytes, Value>,
    config: ReplicaConfig,
    link: Box<dyn StoreLink<FlowBytes>>,
    /// The stage's clock: leases are real time, whatever the packets' timestamps say.
    epoch: Instant,
    counters: Arc<ReplicationCounters>,
    /// What was added to `counters` so far (the replica's and the link's counts, the
    /// packets held).
    published: (
        stateplane_replication::replica::ReplicaCounters,
        LinkCounters,
        usize,
    ),
    next_token: Token,
    /// Per packet of the burst: what becomes of it (`None`: no replicated state).
    slots: Vec<Option<Slot>>,
    /// Where each token of the burst sits in it, while its answers are taken.
    in_burst: FlowMap<Token, usize>,
    /// The burst's flows, and the states after the program of those it processes.
    flows: Vec<BurstFlow>,
    after: FlowStates,
    index_of_flow: FlowIndex,
    /// Per flow of the burst: its last packet's place in the burst (only with a history).
    last_of_flow: Vec<usize>,
    /// Packets held across bursts, and per flow how many.
    held: Held<Hold>,
    queues: FlowMap<FlowBytes, Queue>,
    /// Held packets to process at the next burst, in flow order.
    ready_in: VecDeque<Token>,
    /// Packets of the burst at hand named by an alias that the store resolved before
    /// they were held: admitted again once they are.
    resolved: Vec<(Token, Option<FlowBytes>)>,
    /// Held packets named by an alias no flow has at the store, to be processed as of no
    /// flow once every packet that came before them has been (one of those may make their
    /// flow here: they are then admitted by it), each at the front of a burst, before any
    /// other, so that what it sees is what the program held when its flow was last found
    /// unknown here.
    alone: VecDeque<Token>,
    /// The alone packets that may go now: those that came before every packet held
    /// unprocessed and every packet of the burst at hand (tokens below this).
    alone_before: Token,
    /// Held packets whose outputs may leave (or that are dropped), in flow order.
    ready_out: VecDeque<Token>,
    /// The burst rebuilt with held packets in front ([`Burst::put_in_front`]), and
    /// their slots.
    spare: Burst,
    front: Vec<Option<Slot>>,
    /// Per packet of the burst: whether it stays in it (kept across bursts: no
    /// allocation a burst).
    keep: Vec<bool>,
    requests: Vec<Request<FlowBytes, Value>>,
    replies: Vec<Reply<FlowBytes, Value>>,
    history: Option<Arc<Mutex<History>>>,
    /// History lines not yet written.
    lines: String,
    reach: Reach,
    /// Whether the program checks its flows' leases where it looks them up
    /// ([`Running::check_leases`]; `None`: not asked yet, at the first burst and after a
    /// reload): the stage then admits only the packets the program leaves unprocessed.
    leases_checked: Option<bool>,
    /// The replica's steady marks made and taken away, for the program.
    told: Vec<(FlowBytes, Option<u64>)>,
    /// Flows the stage holds packets of: not marked in the program while it holds any
    /// (the program must not process a packet of theirs ahead of the held ones), and
    /// marked again as the replica says once it holds none. Those newly so, and those
    /// whose held packets are all gone, since the program's marks were last set.
    unleased: HashSet<FlowBytes>,
    to_unlease: Vec<FlowBytes>,
    released: Vec<FlowBytes>,
    /// The packets the program processed under their flow's lease mark that the stage
    /// accounts for (their flow changed, or held packets of it went in front).
    leased: Vec<LeasedPacket>,
    /// The packets the program left whose leases are here, processed again at once.
    again: Burst,
    /// Each packet of `again`: its token and flow (kept across bursts for its room).
    again_of: Vec<(Token, FlowBytes)>,
}

/// The bytes a worker's parked packets may take, on average, each: room for a frame of an
/// ordinary MTU; larger ones fill the parking place sooner (`replication.park_limit`
/// packets, or [`parked_bytes`] of theirs, whichever comes first).
pub const PARKED_FRAME_BYTES: usize = 2048;

/// What one worker's parked packets take at most, their buffers and their keeping.
pub fn parked_bytes(park_limit: usize) -> usize {
    park_limit.saturating_mul(PARKED_FRAME_BYTES)
}

/// What the memory budget is told the parking places of `workers` take (with each
/// replica's fixed keeping).
pub fn parking_claim(park_limit: usize, workers: usize) -> u64 {
    // Each packet's keeping: its descriptor and meta in the map, a map slot's spare room.
    let keeping = 2 * std::mem::size_of::<(u64, HeldPacket<Hold>)>() + 16;
    let fixed = Replica::<FlowBytes, Value>::FIXED_BYTES;
    ((parked_bytes(park_limit) + park_limit * keeping + fixed) * workers) as u64
}

impl ReplicationStage {
    /// Whether the parking place is full for a packet of `len` bytes.
    fn parking_full(&self, len: usize) -> bool {
        self.held.len() >= self.config.park_limit || !self.held.has_room(len)
    }

    fn new(
        replica: Replica<FlowBytes, Value>,
        config: ReplicaConfig,
        link: Box<dyn StoreLink<FlowBytes>>,
        counters: Arc<ReplicationCounters>,
        history: Option<Arc<Mutex<History>>>,
    ) -> Self {
        ReplicationStage {
            replica,
            config,
            link,
            epoch: Instant::now(),
            counters,
            published: (Default::default(), LinkCounters::default(), 0),
            next_token: 0,
            slots: Vec::new(),
            in_burst: FlowMap::default(),
            flows: Vec::new(),
            after: FlowStates::default(),
            last_of_flow: Vec::new(),
            index_of_flow: FlowIndex::default(),
            held: Held::with_limit(parked_bytes(config.park_limit)),
            queues: FlowMap::default(),
            ready_in: VecDeque::new(),
            resolved: Vec::new(),
            alone: VecDeque::new(),
            alone_before: 0,
            ready_out: VecDeque::new(),
            spare: Burst::default(),
            front: Vec::new(),
            keep: Vec::new(),
            requests: Vec::new(),
            replies: Vec::new(),
            history,
            lines: String::new(),
            reach: Reach::default(),
            leases_checked: None,
            told: Vec::new(),
            unleased: HashSet::new(),
            to_unlease: Vec::new(),
            released: Vec::new(),
            leased: Vec::new(),
            again: Burst::default(),
            again_of: Vec::new(),
        }
    }

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

    /// Holds packet `i` of the burst.
    fn hold(&mut self, burst: &Burst, i: usize, token: Token, meta: Hold) {
        if self.leases_checked == Some(true) && self.unleased.insert(meta.key) {
            self.to_unlease.push(meta.key);
        }
        let q = self.queues.entry(meta.key).or_default();
        if meta.processed {
            q.outputs += 1;
        } else {
            q.inputs += 1;
        }
        self.held
            .hold(token, &burst.descs()[i], burst.data(i), meta);
    }

    /// Takes a held packet out (to go back into a burst).
    fn unhold(&mut self, token: Token) -> Option<HeldPacket<Hold>> {
        let packet = self.held.take(token)?;
        self.unqueue(&packet.meta.key, packet.meta.processed);
        Some(packet)
    }

    /// A held packet of flow `key` (an output if `processed`, else an input) no longer
    /// counts among the flow's.
    fn unqueue(&mut self, key: &FlowBytes, processed: bool) {
        if let Some(q) = self.queues.get_mut(key) {
            if processed {
                q.outputs -= 1;
            } else {
                q.inputs -= 1;
            }
            if q.inputs == 0 && q.outputs == 0 {
                self.queues.remove(key);
                if self.unleased.contains(key) {
                    self.released.push(*key);
                }
            }
        }
    }

    /// A held packet is dropped: it leaves with the next burst as a drop (counted there),
    /// behind its flow's others.
    fn drop_held(&mut self, token: Token) {
        let Some(p) = self.held.get_mut(token) else {
            return;
        };
        p.desc.verdict = Verdict::Drop(DropReason::UNREPLICATED);
        if !p.meta.processed {
            p.meta.processed = true;
            let key = p.meta.key;
            if let Some(q) = self.queues.get_mut(&key) {
                q.inputs -= 1;
                q.outputs += 1;
            }
            if self.history.is_some() {
                self.lines.push_str(&format!(
                    "{{\"op\":\"{}\",\"flow\":\"{key:?}\",\"void\":true}}\n",
                    self.op(token)
                ));
            }
        }
        self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        self.ready_out.push_back(token);
    }

    /// The store's answers come so far, handed to the replica.
    fn take_answers(&mut self, now: u64) {
        self.link.receive(&mut self.replies);
        for reply in self.replies.drain(..) {
            self.replica.handle_reply(now, reply);
        }
    }

    /// One exchange with the store: what is due goes, what came is handled, and the
    /// replica's events are applied to the program, to the burst's packets and to the
    /// held ones.
    fn pump(&mut self, program: &mut dyn Running, ctx: &Context) {
        let now = self.now();
        self.reach.saw(self.link.counters().connected > 0, now);
        // Answers that came first: a request answered is not overdue, and an answer may
        // make more to send (a flow's next write), which goes in this exchange.
        self.take_answers(now);
        if self.replica.poll_timeout().is_some_and(|t| t <= now) {
            self.replica.handle_timeout(now);
        }
        self.replica.poll_transmit(now, &mut self.requests);
        let holder = self.replica.holder();
        self.link.send(holder, &mut self.requests);
        // Then those to what was just sent, from a store that answers at once (memory).
        self.take_answers(now);
        while let Some(event) = self.replica.poll_event() {
            match event {
                Event::Install { key, value, .. } => {
                    let state = value.as_deref().filter(|v| !v.is_empty());
                    if !program.install_replicated(&key, state, ctx.now_ns) {
                        self.counters
                            .install_refused
                            .fetch_add(1, Ordering::Relaxed);
                        // The store's state stays there until the program's changes.
                        let mut holds = Vec::new();
                        let mut hint = stateplane_runtime::NO_HINT;
                        program.replicated_state_into(&key, &mut holds, &mut hint);
                        self.replica.program_holds(&key, holds);
                    } else if let Some(alias) = program.replicated_alias_of(&key) {
                        // Its renewals keep the alias alive at the store with it, though
                        // this worker may only read the flow.
                        self.replica.name_alias(key, alias);
                    }
                }
                Event::Forget { key } => {
                    program.install_replicated(&key, None, ctx.now_ns);
                }
                Event::Process { token, .. } => {
                    if let Some(&i) = self.in_burst.get(&token) {
                        // Still in its burst: processed there, unless packets of its
                        // flow held before it are yet to be.
                        if let Some(slot) = &mut self.slots[i] {
                            slot.outcome = if slot.behind {
                                Outcome::HoldInput { ready: true }
                            } else {
                                Outcome::Go
                            };
                        }
                    } else if self.held.get(token).is_some_and(|p| !p.meta.processed) {
                        self.ready_in.push_back(token);
                    }
                }
                Event::Release { token, .. } => {
                    if let Some(&i) = self.in_burst.get(&token) {
                        if let Some(slot) = &mut self.slots[i] {
                            slot.outcome = Outcome::Released;
                        }
                    } else if self.held.get(token).is_some() {
                        self.ready_out.push_back(token);
                    }
                }
                Event::Drop { token, .. } => {
                    if let Some(&i) = self.in_burst.get(&token) {
                        if let Some(slot) = &mut self.slots[i] {
                            slot.outcome = Outcome::Dropped;
                        }
                    } else {
                        self.drop_held(token);
                    }
                }
                Event::Resolved { token, flow, .. } => {
                    if self.in_burst.contains_key(&token) {
                        self.resolved.push((token, flow));
                    } else {
                        self.readmit(token, flow, program);
                    }
                }
            }
        }
    }

    /// Packets to be processed as of no flow whose flow the program has come to know
    /// since (made here by a packet processed meanwhile) are admitted by its key instead:
    /// they must not see its state unaccounted for.
    fn recheck_alone(&mut self, program: &mut dyn Running, ctx: &Context) {
        if self.alone.is_empty() {
            return;
        }
        let known: Vec<(Token, FlowBytes)> = (self.alone.iter())
            .filter_map(|&t| {
                let p = self.held.get(t)?;
                Some((t, program.replicated_key(&p.desc, &p.data)?))
            })
            .collect();
        if !known.is_empty() {
            self.alone.retain(|t| !known.iter().any(|(k, _)| k == t));
            for (token, flow) in known {
                self.readmit(token, Some(flow), program);
            }
            self.pump(program, ctx);
        }
        // Those held unprocessed, and the burst's own (processed behind the front).
        let held = &self.held;
        let waiting = (held.tokens()).filter(|&t| {
            held.get(t)
                .is_some_and(|p| !p.meta.processed && !p.meta.alone)
        });
        let in_burst = self.slots.iter().flatten().map(|slot| slot.token);
        self.alone_before = waiting.chain(in_burst).min().unwrap_or(Token::MAX);
    }

    /// A held packet named by an alias, whose flow the store named (`flow`; `None`: no
    /// flow has the alias), is admitted again by its flow's key, behind the flow's packets
    /// held before it; with none, unless the program now knows its flow itself (made here
    /// since it came), it is processed as a packet of no replicated flow.
    fn readmit(&mut self, token: Token, flow: Option<FlowBytes>, program: &dyn Running) {
        let now = self.now();
        let Some(p) = self.held.get(token).filter(|p| !p.meta.processed) else {
            return;
        };
        // Named by its alias while it was held (its flow's key, once admitted by it).
        let alias = p.meta.key;
        let Some(flow) = flow.or_else(|| program.replicated_key(&p.desc, &p.data)) else {
            if let Some(p) = self.held.get_mut(token) {
                p.meta.alone = true;
            }
            self.alone.push_back(token);
            return;
        };
        if let Some(p) = self.held.get_mut(token) {
            p.meta.key = flow;
            p.meta.alone = false;
        }
        self.unqueue(&alias, false);
        self.queues.entry(flow).or_default().inputs += 1;
        // Its flow's later packets wait behind it.
        if self.leases_checked == Some(true) && self.unleased.insert(flow) {
            self.to_unlease.push(flow);
        }
        match self.replica.admit(now, flow, token) {
            Admit::Process => self.ready_in.push_back(token),
            Admit::Parked => {}
            Admit::Dropped(_) => self.drop_held(token),
        }
    }

    /// A return line for an output that leaves.
    fn history_return(
        &mut self,
        token: Token,
        verdict: Verdict,
        output: &[u8],
        state: &Option<Option<Value>>,
        at: u64,
    ) {
        let state = match state {
            Some(Some(s)) => format!("\"{}\"", hex(s)),
            Some(None) => "\"\"".to_string(),
            None => "null".to_string(),
        };
        self.lines.push_str(&format!(
            "{{\"op\":\"{}\",\"return_ns\":{at},\"verdict\":\"{verdict:?}\",\"output\":\"{}\",\"state\":{state}}}\n",
            self.op(token),
            hex(output),
        ));
    }

    fn publish(&mut self) {
        let (r, l, held) = (self.replica.counters, self.link.counters(), self.held.len());
        let (pr, pl, pheld) = &self.published;
        let c = &*self.counters;
        let add = add_since;
        add(&c.writes, r.writes, pr.writes);
        add(&c.coalesced, r.coalesced, pr.coalesced);
        add(&c.acquires, r.acquires, pr.acquires);
        add(&c.renewals, r.renewals, pr.renewals);
        add(&c.retransmits, r.retransmits, pr.retransmits);
        add(&c.migrated, r.migrated, pr.migrated);
        add(&c.waited, r.waited, pr.waited);
        add(&c.fenced, r.fenced, pr.fenced);
        add(&c.retaken, r.retaken, pr.retaken);
        add(&c.resolves, r.resolves, pr.resolves);
        add(&c.resolved, r.resolved, pr.resolved);
        c.publish_link_and_held((l, held, self.held.most()), (*pl, *pheld));
        self.published = (r, l, held);
    }

    /// Puts held packets whose lease came in front of the burst, as many as fit: they
    /// are processed first, before any later packet of their flow. Their slots go into
    /// `front`, in order.
    fn put_ready_in_front(&mut self, burst: &mut Burst, front: &mut Vec<Option<Slot>>) {
        front.clear();
        let held = &self.held;
        self.alone
            .retain(|&t| held.get(t).is_some_and(|p| !p.meta.processed));
        self.drop_lapsed_ready();
        if self.ready_in.is_empty() && !self.alone.iter().any(|&t| t < self.alone_before) {
            return;
        }
        if self.spare.capacity() != burst.capacity() {
            self.spare = Burst::with_capacity(burst.capacity());
        }
        // Packets of no flow first, before anything that could make their flow here; then,
        // with a history, one packet a flow a burst (its state after it is then known).
        let before = self.alone_before;
        let mut chosen = Vec::with_capacity(self.alone.len() + self.ready_in.len());
        chosen.extend(self.alone.iter().copied().filter(|&t| t < before));
        let alone = chosen.len();
        let mut flows = HashSet::new();
        for &token in &self.ready_in {
            if let Some(p) = self.held.get(token)
                && (self.history.is_none() || flows.insert(p.meta.key))
            {
                chosen.push(token);
            }
        }
        let held = &self.held;
        let packets = (chosen.iter())
            .filter_map(|&t| held.get(t))
            .map(|p| (&p.desc, &p.data[..]));
        let put = burst.put_in_front(&mut self.spare, packets);
        chosen.truncate(put);
        if alone > 0 {
            let gone = &chosen[..put.min(alone)];
            self.alone.retain(|t| !gone.contains(t));
        }
        let put = put.saturating_sub(alone);
        if self.history.is_none() {
            // Every ready packet was chosen, in order: the first `put` went.
            self.ready_in.drain(..put);
        } else {
            let taken: HashSet<Token> = chosen.iter().copied().collect();
            self.ready_in.retain(|t| !taken.contains(t));
        }
        for token in chosen {
            if let Some(p) = self.unhold(token) {
                if p.meta.alone {
                    front.push(None);
                    self.held.recycle(p);
                    continue;
                }
                let flow = self.flow_index(p.meta.key);
                front.push(Some(Slot {
                    token,
                    outcome: Outcome::Go,
                    behind: false,
                    flow,
                }));
                self.held.recycle(p);
            }
        }
    }

    /// Keeps in `ready_in` only held inputs still to be processed; one whose lease passed
    /// while it was held is not processed: dropped.
    fn drop_lapsed_ready(&mut self) {
        let now = self.now();
        let mut lapsed = Vec::new();
        let (held, replica) = (&self.held, &self.replica);
        self.ready_in.retain(|&t| match held.get(t) {
            Some(p) if !p.meta.processed => {
                let holds = replica.holds(&p.meta.key, now);
                if !holds {
                    lapsed.push(t);
                }
                holds
            }
            _ => false,
        });
        for token in lapsed {
            self.drop_held(token);
        }
    }

    /// Whether the program checks its flows' leases where it looks them up, asked once
    /// (at the first burst, and the first after a reload); when it does, the replica tells
    /// the stage its steady marks, for the program. Not with a history, which reads each
    /// flow's state after each of its packets.
    fn leases_checked(&mut self, program: &mut dyn Running) -> bool {
        if let Some(on) = self.leases_checked {
            return on;
        }
        let on = self.history.is_none() && program.check_leases();
        if on {
            program.clear_leases();
            self.replica.tell_steady();
            self.unleased.extend(self.queues.keys().copied());
            self.to_unlease.extend(self.queues.keys().copied());
        }
        self.leases_checked = Some(on);
        on
    }

    /// [`StateStage::before_program`] for a program that checks its flows' leases: the
    /// burst's own packets go to it as they came (it processes those of flows marked
    /// leased, and leaves the others for [`ReplicationStage::admit_left`]), behind the
    /// held packets now ready, which it processes as admitted.
    fn before_checked(&mut self, burst: &mut Burst, program: &mut dyn Running, ctx: &Context) {
        self.slots.clear();
        self.in_burst.clear();
        self.flows.clear();
        self.index_of_flow.clear(burst.capacity());
        self.slots.resize_with(burst.len(), || None);
        self.pump(program, ctx);
        if !self.resolved.is_empty() {
            for (token, flow) in std::mem::take(&mut self.resolved) {
                self.readmit(token, flow, program);
            }
            self.pump(program, ctx);
        }
        self.recheck_alone(program, ctx);
        let mut front = std::mem::take(&mut self.front);
        self.put_ready_in_front(burst, &mut front);
        let admitted = front.len();
        if admitted > 0 {
            front.append(&mut self.slots);
            std::mem::swap(&mut front, &mut self.slots);
        }
        self.front = front;
        for (i, d) in burst.descs_mut().iter_mut().enumerate() {
            d.lease_check = (i >= admitted).then_some(i as u16);
        }
        for slot in self.slots.iter().flatten() {
            self.flows[slot.flow].processed = true;
        }
        self.tell_program_leases(program);
    }

    /// Sets the program's lease marks as the replica's stand now, but for a flow the
    /// stage holds a packet of (every such flow is in `unleased`): its packets wait
    /// behind that one. A flow whose held packets are all gone on is marked again as the
    /// replica says.
    fn tell_program_leases(&mut self, program: &mut dyn Running) {
        let now = self.now();
        program.set_lease_clock(now);
        self.replica.take_steady_told(&mut self.told);
        for (key, until) in self.told.drain(..) {
            if !self.unleased.contains(&key) {
                program.mark_leased(&key, until);
            }
        }
        for key in self.to_unlease.drain(..) {
            program.mark_leased(&key, None);
        }
        for key in self.released.drain(..) {
            if !self.queues.contains_key(&key) && self.unleased.remove(&key) {
                let until = self.replica.steady_for_program(&key, now);
                program.mark_leased(&key, until);
            }
        }
    }

    /// [`StateStage::after_program`]'s first step where the program checks its flows'
    /// leases: each packet it left unprocessed is admitted, and processed again at once
    /// if its lease is here and its flow holds no packet, else held for a later burst;
    /// held packets now ready are processed in the room the left ones freed; and the packets it processed under their lease mark whose flows may have changed
    /// (there, or by a held packet processed in front of them) are given slots, to be
    /// accounted for as admitted packets are.
    fn admit_left(&mut self, burst: &mut Burst, program: &mut dyn Running, ctx: &Context) {
        // With held packets in front, every packet found under its mark is looked at.
        let every = !self.flows.is_empty();
        let mut leased = std::mem::take(&mut self.leased);
        let found = program.take_leased_changes(every, &mut leased);
        self.replica.admitted_steady(found);
        for p in leased.iter().filter(|p| p.changed) {
            self.flow_index(p.flow);
        }
        let mut slotted = 0;
        for p in leased.drain(..) {
            let i = usize::from(p.place);
            let flow = self.index_of_flow.find(&self.flows, &p.flow);
            if let (Some(flow), Some(None)) = (flow, self.slots.get(i)) {
                self.flows[flow].processed = true;
                let token = self.next_token;
                self.next_token += 1;
                self.slots[i] = Some(Slot {
                    token,
                    outcome: Outcome::Go,
                    behind: false,
                    flow,
                });
                slotted += 1;
            }
        }
        self.leased = leased;
        let left = |d: &PacketDesc| d.verdict == Verdict::Drop(DropReason::NOT_LEASED);
        // Those found under their mark and not given a slot (whose are counted with it).
        (self.counters.processed).fetch_add(found.saturating_sub(slotted), Ordering::Relaxed);
        let Some(first) = burst.descs().iter().position(left) else {
            return;
        };
        let now = self.now();
        let (mut keep, mut dropped) = (std::mem::take(&mut self.keep), 0);
        keep.clear();
        keep.resize(first, true);
        // Those whose lease is here, no packet of their flow waiting to be processed:
        // processed again at once, as admitted, behind the burst's own (a flow's packets
        // are all left or none).
        let mut again = std::mem::take(&mut self.again_of);
        again.clear();
        if self.again.capacity() != burst.capacity() {
            self.again = Burst::with_capacity(burst.capacity());
        }
        self.again.clear();
        self.again.now_ns = burst.now_ns;
        for i in first..burst.len() {
            if !left(&burst.descs()[i]) {
                keep.push(true);
                continue;
            }
            let (desc, data) = (&burst.descs()[i], burst.data(i));
            let key = match program.replicated_key(desc, data) {
                Some(key) => Some(Ok(key)),
                // An alias of a flow known here is that flow.
                None => program
                    .replicated_alias(desc, data)
                    .map(|alias| self.replica.flow_of_alias(&alias).ok_or(alias)),
            };
            match key {
                Some(Ok(key)) => {
                    // As it came: the program did nothing with it.
                    burst.descs_mut()[i].verdict = Verdict::Drop(DropReason::NO_VERDICT);
                    if let Some(token) = self.admit_for_later(burst, i, key, now) {
                        again.push((token, key));
                        let mut desc = burst.descs()[i];
                        desc.lease_check = None;
                        self.again.push_desc(&desc, burst.data(i));
                    }
                    keep.push(false);
                }
                Some(Err(alias)) => {
                    burst.descs_mut()[i].verdict = Verdict::Drop(DropReason::NO_VERDICT);
                    self.admit_alias_for_later(burst, i, alias, now);
                    keep.push(false);
                }
                // Left, yet of no flow (a program's mistake): never let through as it is.
                None => {
                    burst.descs_mut()[i].verdict = Verdict::Drop(DropReason::UNREPLICATED);
                    dropped += 1;
                    keep.push(true);
                }
            }
        }
        if keep.contains(&false) {
            retain_kept(burst, &keep);
            let mut i = 0;
            self.slots.retain(|_| {
                i += 1;
                keep[i - 1]
            });
        }
        self.keep = keep;
        self.counters.dropped.fetch_add(dropped, Ordering::Relaxed);
        // Held packets now ready go through too, in the room the left ones freed, in the
        // order they came (a flow's left ones were held behind its others): a full burst,
        // as a capture's are, had no room for them in front.
        let mut room = burst.capacity().saturating_sub(burst.len() + again.len());
        if room > 0 && !self.ready_in.is_empty() {
            self.drop_lapsed_ready();
        }
        while room > 0
            && let Some(token) = self.ready_in.pop_front()
        {
            if let Some(p) = self.unhold(token) {
                let desc = PacketDesc {
                    lease_check: None,
                    ..p.desc
                };
                self.again.push_desc(&desc, &p.data);
                again.push((token, p.meta.key));
                self.held.recycle(p);
                room -= 1;
            }
        }
        if again.is_empty() {
            self.again_of = again;
            return;
        }
        let mut ctx = Context { ..*ctx };
        let mut done = std::mem::take(&mut self.again);
        program.process(&mut done, &mut ctx);
        for (i, &(token, key)) in again.iter().enumerate() {
            if !burst.push_desc(&done.descs()[i], done.data(i)) {
                // Never: no more were taken than the burst has room for.
                let meta = Hold {
                    key,
                    alone: false,
                    processed: true,
                    state: None,
                };
                self.hold(&done, i, token, meta);
                self.drop_held(token);
                continue;
            }
            let flow = self.flow_index(key);
            self.flows[flow].processed = true;
            self.slots.push(Some(Slot {
                token,
                outcome: Outcome::Go,
                behind: false,
                flow,
            }));
        }
        self.again = done;
        self.again_of = again;
    }

    /// A packet the program left unprocessed, its flow `key` not marked leased: admitted,
    /// and its token if its lease is here and no packet of its flow waits to be
    /// processed (it is to be processed now; its output goes behind its flow's held
    /// ones); else held to be processed in a later burst (when its lease comes, or behind
    /// its flow's held packets), or dropped if the parking place is full.
    fn admit_for_later(
        &mut self,
        burst: &Burst,
        i: usize,
        key: FlowBytes,
        now: u64,
    ) -> Option<Token> {
        let token = self.next_token;
        self.next_token += 1;
        let behind = held_of(&self.queues, &key).is_some_and(|q| q.inputs > 0);
        let full = self.parking_full(burst.data(i).len());
        let admit = match full && (behind || !self.replica.holds(&key, now)) {
            true => Admit::Dropped(ReplicaDrop::ParkFull),
            false => self.replica.admit_placed(now, key, token).0,
        };
        if admit == Admit::Process && !behind {
            return Some(token);
        }
        let meta = Hold {
            key,
            alone: false,
            processed: false,
            state: None,
        };
        self.hold(burst, i, token, meta);
        match admit {
            Admit::Process => self.ready_in.push_back(token),
            Admit::Parked => {
                self.counters
                    .waited_for_lease
                    .fetch_add(1, Ordering::Relaxed);
            }
            Admit::Dropped(_) => self.drop_held(token),
        }
        None
    }

    /// A packet the program left unprocessed, named by an alias no flow here has: held
    /// while the store is asked which flow it is (admitted by that flow once it is
    /// named, [`ReplicationStage::readmit`]), or dropped if the parking place is full.
    fn admit_alias_for_later(&mut self, burst: &Burst, i: usize, alias: FlowBytes, now: u64) {
        let token = self.next_token;
        self.next_token += 1;
        let full = self.parking_full(burst.data(i).len());
        let meta = Hold {
            key: alias,
            alone: false,
            processed: false,
            state: None,
        };
        self.hold(burst, i, token, meta);
        match !full && self.replica.admit_alias(now, alias, token) == Admit::Parked {
            true => {
                self.counters
                    .waited_for_lease
                    .fetch_add(1, Ordering::Relaxed);
            }
            false => self.drop_held(token),
        }
    }

    /// Flow `key`'s place among the burst's flows (added if new).
    fn flow_index(&mut self, key: FlowBytes) -> usize {
        self.index_of_flow.find_or_add(&mut self.flows, key)
    }

    /// A call line for a packet about to be processed.
    fn history_call(&mut self, token: Token, key: &FlowBytes, burst: &Burst, i: usize, at: u64) {
        let line = format!(
            "{{\"op\":\"{}\",\"flow\":\"{key:?}\",\"call_ns\":{at},\"len\":{},\"input\":\"{}\"}}\n",
            self.op(token),
            burst.descs()[i].orig_len,
            hex(burst.data(i)),
        );
        self.lines.push_str(&line);
    }
}

impl StateStage for ReplicationStage {
    fn before_program(&mut self, burst: &mut Burst, program: &mut dyn Running, ctx: &Context) {
        if self.leases_checked(program) {
            return self.before_checked(burst, program, ctx);
        }
        self.slots.clear();
        self.in_burst.clear();
        self.flows.clear();
        self.index_of_flow.clear(burst.capacity());
        let now = self.now();
        for (i, d) in burst.descs().iter().enumerate() {
            let (key, by_alias) = match program.replicated_key(d, burst.data(i)) {
                Some(key) => (key, false),
                None => match program.replicated_alias(d, burst.data(i)) {
                    // An alias of a flow known here is that flow.
                    Some(alias) => match self.replica.flow_of_alias(&alias) {
                        Some(key) => (key, false),
                        None => (alias, true),
                    },
                    None => {
                        self.slots.push(None);
                        continue;
                    }
                },
            };
            let token = self.next_token;
            self.next_token += 1;
            if by_alias {
                // Held while the store is asked which flow it is (or dropped with no room).
                let full = self.parking_full(burst.data(i).len());
                let outcome = match full {
                    true => Outcome::Dropped,
                    false => match self.replica.admit_alias(now, key, token) {
                        Admit::Parked => {
                            self.in_burst.insert(token, i);
                            Outcome::HoldInput { ready: false }
                        }
                        _ => Outcome::Dropped,
                    },
                };
                self.flows.push(BurstFlow::new(key));
                self.slots.push(Some(Slot {
                    token,
                    outcome,
                    behind: false,
                    flow: self.flows.len() - 1,
                }));
                continue;
            }
            let flow = self.flow_index(key);
            if self.flows[flow].go {
                self.replica.admitted_again();
                self.slots.push(Some(Slot {
                    token,
                    outcome: Outcome::Go,
                    behind: false,
                    flow,
                }));
                continue;
            }
            // Held packets of its flow still to be processed go first.
            let behind = held_of(&self.queues, &key).is_some_and(|q| q.inputs > 0);
            // The stage holds at most `park_limit` packets, and past it only outputs of
            // this burst that wait for the store: a packet that would be held unprocessed
            // is dropped before the replica sees it.
            let full = self.parking_full(burst.data(i).len());
            // A steady flow's packet is processed (behind its held ones) with no more asked.
            let steady = match full && behind {
                true => None,
                false => self.replica.admit_steady(now, &key),
            };
            let (admit, places) = match steady {
                Some(places) => (Admit::Process, places),
                None if full && (behind || !self.replica.holds(&key, now)) => {
                    (Admit::Dropped(ReplicaDrop::ParkFull), Places::NONE)
                }
                None => self.replica.admit_placed(now, key, token),
            };
            self.flows[flow].places = places;
            let outcome = match admit {
                Admit::Process if !behind => Outcome::Go,
                Admit::Process => Outcome::HoldInput { ready: true },
                Admit::Parked => {
                    self.in_burst.insert(token, i);
                    Outcome::HoldInput { ready: false }
                }
                Admit::Dropped(_) => Outcome::Dropped,
            };
            self.flows[flow].go = outcome == Outcome::Go;
            self.slots.push(Some(Slot {
                token,
                outcome,
                behind,
                flow,
            }));
        }
        // Leases asked for go, and those granted at once (a store in this process, an
        // answer already here) let their packets be processed in this burst.
        self.pump(program, ctx);
        self.in_burst.clear();
        // Packets not processed now leave the burst: held, or dropped (to leave as drops
        // at the end of the burst, counted there).
        let call_ns = wall_ns();
        let mut keep = std::mem::take(&mut self.keep);
        keep.clear();
        // With a history, a flow's packets after its first of the burst wait for the next
        // (so that each one's state after it is known: a flow's last of a burst).
        let mut flows = HashSet::new();
        for i in 0..self.slots.len() {
            let Some(slot) = &mut self.slots[i] else {
                keep.push(true);
                continue;
            };
            if self.history.is_some() && slot.outcome == Outcome::Go && !flows.insert(slot.flow) {
                slot.outcome = Outcome::HoldInput { ready: true };
            }
            let (token, outcome, flow) = (slot.token, slot.outcome, slot.flow);
            if outcome == Outcome::Go {
                if self.history.is_some() {
                    let key = self.flows[flow].key;
                    self.history_call(token, &key, burst, i, call_ns);
                }
                keep.push(true);
                continue;
            }
            if let Outcome::HoldInput { ready: false } = outcome {
                self.counters
                    .waited_for_lease
                    .fetch_add(1, Ordering::Relaxed);
            }
            let meta = Hold {
                key: self.flows[flow].key,
                alone: false,
                processed: false,
                state: None,
            };
            match outcome {
                Outcome::HoldInput { ready } => {
                    self.hold(burst, i, token, meta);
                    if ready {
                        self.ready_in.push_back(token);
                    }
                }
                _ => {
                    self.hold(burst, i, token, meta);
                    self.drop_held(token);
                }
            }
            keep.push(false);
        }
        if keep.contains(&false) {
            retain_kept(burst, &keep);
            let mut i = 0;
            self.slots.retain(|_| {
                i += 1;
                keep[i - 1]
            });
        }
        self.keep = keep;
        // Packets whose alias the store named meanwhile are held now: admitted again.
        if !self.resolved.is_empty() {
            for (token, flow) in std::mem::take(&mut self.resolved) {
                self.readmit(token, flow, program);
            }
            self.pump(program, ctx);
        }
        // Held packets whose lease has come go in front, behind those of no flow.
        self.recheck_alone(program, ctx);
        let mut front = std::mem::take(&mut self.front);
        self.put_ready_in_front(burst, &mut front);
        if !front.is_empty() {
            for (i, slot) in front.iter_mut().enumerate() {
                if let Some(slot) = slot
                    && self.history.is_some()
                {
                    let key = self.flows[slot.flow].key;
                    self.history_call(slot.token, &key, burst, i, call_ns);
                }
            }
            front.append(&mut self.slots);
            std::mem::swap(&mut front, &mut self.slots);
        }
        self.front = front;
        for slot in self.slots.iter().flatten() {
            self.flows[slot.flow].processed = true;
        }
    }

    fn after_program(&mut self, burst: &mut Burst, program: &mut dyn Running, ctx: &Context) {
        if self.leases_checked == Some(true) {
            self.admit_left(burst, program, ctx);
        }
        self.write_history();
        let now = self.now();
        // Each flow's state after the burst (compared with the replica's with its first
        // packet, written once if it differs); whether its outputs wait (the burst's own
        // go behind them).
        self.after.clear();
        for flow in self.flows.iter_mut() {
            if !flow.processed {
                self.after.skip();
                continue;
            }
            self.after.push(program, &flow.key, &mut flow.places.state);
            flow.outputs_held = held_of(&self.queues, &flow.key).is_some_and(|q| q.outputs > 0);
        }
        let (mut processed, mut folded) = (0u64, 0u64);
        self.in_burst.clear();
        // Packets of no flow the stage accounts for have no slot: with no such flow, none
        // has (a burst of flows steady in a program that checks their leases).
        let slotted = match self.flows.is_empty() {
            true => 0,
            false => self.slots.len(),
        };
        for i in 0..slotted {
            let Some(slot) = &self.slots[i] else { continue };
            let (token, flow) = (slot.token, slot.flow);
            let key = self.flows[flow].key;
            processed += 1;
            // When the state times out, in the stage's time (the store is told).
            let lives_until = match self.after.deadline_ns(flow) {
                None | Some(u64::MAX) => u64::MAX,
                Some(deadline) => now.saturating_add(deadline.saturating_sub(ctx.now_ns)),
            };
            // The flow's change goes with its first packet; the others' fold into it.
            let BurstFlow {
                compared,
                changed,
                outputs_held: behind,
                ..
            } = self.flows[flow];
            let release = if compared {
                folded += u64::from(changed);
                let places = self.flows[flow].places;
                (self.replica).processed_again(now, key, token, places, lives_until)
            } else {
                let state = self.after.get(flow).unwrap_or_default();
                let places = self.flows[flow].places;
                let (release, changed) = (self.replica).processed_with_state(
                    now,
                    key,
                    token,
                    state,
                    places,
                    lives_until,
                );
                (self.flows[flow].compared, self.flows[flow].changed) = (true, changed);
                // Its writes carry the alias from this one on (they go at the next pump).
                if changed && let Some(alias) = program.replicated_alias_of(&key) {
                    self.replica.name_alias(key, alias);
                }
                release
            };
            let outcome = match release {
                Release::Now => Outcome::Released,
                Release::Parked => {
                    self.counters
                        .waited_for_store
                        .fetch_add(1, Ordering::Relaxed);
                    Outcome::Parked
                }
                Release::Dropped(_) => Outcome::Dropped,
            };
            // Only a held packet's answers are still to come.
            if outcome == Outcome::Parked {
                self.in_burst.insert(token, i);
            }
            if let Some(slot) = &mut self.slots[i] {
                slot.outcome = outcome;
                slot.behind = behind;
            }
        }
        self.counters
            .processed
            .fetch_add(processed, Ordering::Relaxed);
        self.counters.coalesced.fetch_add(folded, Ordering::Relaxed);
        // The burst's writes go, and what has come back is taken (without waiting).
        self.pump(program, ctx);
        self.in_burst.clear();
        // A flow's last packet of the burst shows the state the burst's write carried.
        self.last_of_flow.clear();
        self.last_of_flow.resize(self.flows.len(), usize::MAX);
        if self.history.is_some() {
            for (i, slot) in self.slots.iter().enumerate() {
                if let Some(slot) = slot {
                    self.last_of_flow[slot.flow] = i;
                }
            }
        }
        let return_ns = wall_ns();
        let mut keep = std::mem::take(&mut self.keep);
        keep.clear();
        let mut dropped = 0;
        for i in 0..slotted {
            let Some(slot) = &self.slots[i] else {
                keep.push(true);
                continue;
            };
            let (token, outcome, behind, flow) = (slot.token, slot.outcome, slot.behind, slot.flow);
            let state =
                (self.last_of_flow[flow] == i).then(|| self.after.get(flow).map(<[u8]>::to_vec));
            match outcome {
                Outcome::Dropped => {
                    burst.descs_mut()[i].verdict = Verdict::Drop(DropReason::UNREPLICATED);
                    dropped += 1;
                    keep.push(true);
                }
                Outcome::Released if !behind => {
                    if self.history.is_some() {
                        let verdict = burst.descs()[i].verdict;
                        self.history_return(token, verdict, burst.data(i), &state, return_ns);
                    }
                    keep.push(true);
                }
                _ => {
                    let meta = Hold {
                        key: self.flows[flow].key,
                        alone: false,
                        processed: true,
                        state,
                    };
                    self.hold(burst, i, token, meta);
                    if outcome == Outcome::Released {
                        self.ready_out.push_back(token);
                    }
                    keep.push(false);
                }
            }
        }
        self.counters.dropped.fetch_add(dropped, Ordering::Relaxed);
        if keep.contains(&false) {
            retain_kept(burst, &keep);
        }
        self.keep = keep;
        // Held outputs free to leave go behind the burst's own, as many as fit.
        while let Some(&token) = self.ready_out.front() {
            let Some(p) = self.held.get(token) else {
                self.ready_out.pop_front();
                continue;
            };
            if !burst.push_desc(&p.desc, &p.data) {
                break;
            }
            self.ready_out.pop_front();
            let Some(p) = self.unhold(token) else {
                continue;
            };
            if self.history.is_some() && !matches!(p.desc.verdict, Verdict::Drop(_)) {
                self.history_return(token, p.desc.verdict, &p.data, &p.meta.state, return_ns);
            }
            self.held.recycle(p);
        }
        self.write_history();
        self.publish();
    }

    fn after_burst(&mut self, _program: &mut dyn Running, _ctx: &Context) {}

    fn tick(&mut self, program: &mut dyn Running, ctx: &Context) {
        self.pump(program, ctx);
        self.write_history();
        self.publish();
    }

    /// The replica starts over as the same holder, so each flow's next packet is granted
    /// its lease again with the store's state, installed over whatever the new instance
    /// kept of the old one's (`Program::inherit`): the store's is the state committed.
    /// Packets held for the old instance are dropped (counted): it takes no more packets.
    fn reloaded(&mut self, _old: &mut dyn Running, _program: &mut dyn Running, _ctx: &Context) {
        self.replica = Replica::new(self.replica.holder(), self.config);
        // The new instance is asked whether it checks leases, its marks all taken away.
        self.leases_checked = None;
        self.told.clear();
        self.unleased.clear();
        self.to_unlease.clear();
        self.released.clear();
        // Outputs already acknowledged still leave; every other held packet is dropped.
        self.ready_in.clear();
        self.alone.clear();
        let leaving: HashSet<Token> = self.ready_out.iter().copied().collect();
        let tokens: Vec<Token> = (self.held.tokens())
            .filter(|t| !leaving.contains(t))
            .collect();
        for token in tokens {
            self.drop_held(token);
        }
    }

    fn finish(&mut self, program: &mut dyn Running, ctx: &Context) {
        self.pump(program, ctx);
        self.publish();
        self.write_history();
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        self.link.wake_fd()
    }

    fn holding(&self) -> usize {
        self.held.len()
    }

    fn releasable(&self) -> bool {
        !self.ready_in.is_empty()
            || !self.ready_out.is_empty()
            || self.alone.iter().any(|&t| t < self.alone_before)
    }

    /// Half the park bound waits for the store (leases, acknowledgements), so that
    /// another burst or two of new flows could overflow it; or [`BACKLOG`] do, a queue at
    /// the store long enough that requests reach it late for their leases. Never once
    /// the store has been out of reach for the park timeout: what waits for it is
    /// dropped then anyway, and a run over a capture would otherwise wait that long for
    /// each half park of the rest.
    fn backlogged(&self) -> bool {
        if (self.reach).lost_for(self.config.park_timeout_ns, || self.now()) {
            return false;
        }
        let ready = self.ready_in.len() + self.ready_out.len() + self.alone.len();
        let waiting = self.held.len().saturating_sub(ready);
        waiting >= self.config.park_limit.div_ceil(2).min(BACKLOG)
    }
}

/// The stage in a worker, on a store whose answers the test lets through when it likes:
/// the worker never waits for them, held packets come back in later bursts in their
/// flow's order, and those held too long leave as drops, counted.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_store::{Gated, Sent};
    use stateplane_runtime::{Counter, Program, Worker};
    use stateplane_wire::FlowHasher;
    use std::sync::atomic::AtomicBool;

    /// A count per flow (the packet's input port), written into each packet's first eight
    /// bytes: each output shows the state it saw.
    #[derive(Default)]
    struct Tally {
        counts: FlowMap<FlowBytes, u64>,
    }

    fn flow(port: u16) -> FlowBytes {
        FlowBytes::new(&port.to_be_bytes()).unwrap()
    }

    /// The burst's index of flows finds every flow it added, past the size it was emptied
    /// with (held packets put in front of a burst of new flows), and never a place it did
    /// not index (a packet named by an alias).
    #[test]
    fn the_burst_index_finds_every_flow_it_added_past_its_first_size() {
        let mut index = FlowIndex::default();
        index.clear(4);
        let mut flows = vec![BurstFlow::new(flow(9_999))];
        let places: Vec<usize> = (0..100)
            .map(|port| index.find_or_add(&mut flows, flow(port)))
            .collect();
        assert_eq!(places, (1..=100).collect::<Vec<_>>());
        for (port, &place) in (0..100).zip(&places) {
            assert_eq!(index.find_or_add(&mut flows, flow(port)), place);
            assert!(flows[place].key == flow(port));
        }
        assert_eq!(flows.len(), 101);
        // The alias's key asked as a flow's is a flow of its own.
        assert_eq!(index.find_or_add(&mut flows, flow(9_999)), 101);
        // Emptied for the next burst: every flow is new again.
        flows.clear();
        index.clear(4);
        assert_eq!(index.find_or_add(&mut flows, flow(7)), 0);
    }

    /// A flow's count as its replicated state: eight bytes.
    fn count_state(counts: &FlowMap<FlowBytes, u64>, key: &FlowBytes) -> Option<Vec<u8>> {
        counts.get(key).map(|c| c.to_le_bytes().to_vec())
    }

    fn install_count(
        counts: &mut FlowMap<FlowBytes, u64>,
        key: &FlowBytes,
        state: Option<&[u8]>,
    ) -> bool {
        match state.map(<[u8; 8]>::try_from) {
            None => {
                counts.remove(key);
            }
            Some(Ok(bytes)) => {
                counts.insert(*key, u64::from_le_bytes(bytes));
            }
            Some(Err(_)) => return false,
        }
        true
    }

    impl Program for Tally {
        type Prepared = ();

        fn process(&mut self, burst: &mut Burst, _ctx: &mut Context) {
            for p in burst.iter_mut() {
                let count = self.counts.entry(flow(p.desc.in_port)).or_default();
                *count += 1;
                p.data[..8].copy_from_slice(&count.to_le_bytes());
                p.desc.verdict = Verdict::Forward(0);
            }
        }

        fn replicated_key(
            &self,
            packet: &stateplane_runtime::PacketDesc,
            _: &[u8],
        ) -> Option<FlowBytes> {
            Some(flow(packet.in_port))
        }

        fn replicated_state(&self, key: &FlowBytes) -> Option<Vec<u8>> {
            count_state(&self.counts, key)
        }

        fn install_replicated(&mut self, key: &FlowBytes, state: Option<&[u8]>, _: u64) -> bool {
            install_count(&mut self.counts, key, state)
        }
    }

    /// A count per flow, opened and counted by packets from port 0 (the flow is the
    /// packet's sequence number's tens); packets from port 1 only read it, and name their
    /// flow by alias (the flow plus 1,000) where it has no count here; packets from port 2
    /// read it by its key. Each output shows the count it saw (0: none).
    #[derive(Default)]
    struct Opened {
        counts: FlowMap<FlowBytes, u64>,
    }

    fn opened_flow(d: &stateplane_runtime::PacketDesc) -> u16 {
        (d.seq / 10) as u16
    }

    impl Program for Opened {
        type Prepared = ();

        fn process(&mut self, burst: &mut Burst, _ctx: &mut Context) {
            for p in burst.iter_mut() {
                let key = flow(opened_flow(p.desc));
                let count = if p.desc.in_port == 0 {
                    let c = self.counts.entry(key).or_default();
                    *c += 1;
                    *c
                } else {
                    self.counts.get(&key).copied().unwrap_or(0)
                };
                p.data[..8].copy_from_slice(&count.to_le_bytes());
                p.desc.verdict = Verdict::Forward(0);
            }
        }

        fn replicated_key(
            &self,
            d: &stateplane_runtime::PacketDesc,
            _: &[u8],
        ) -> Option<FlowBytes> {
            let key = flow(opened_flow(d));
            (d.in_port != 1 || self.counts.contains_key(&key)).then_some(key)
        }

        fn replicated_alias(
            &self,
            d: &stateplane_runtime::PacketDesc,
            _: &[u8],
        ) -> Option<FlowBytes> {
            let f = opened_flow(d);
            (d.in_port == 1 && !self.counts.contains_key(&flow(f))).then(|| flow(f + 1_000))
        }

        fn replicated_alias_of(&self, key: &FlowBytes) -> Option<FlowBytes> {
            let f = u16::from_be_bytes(key.as_bytes().try_into().ok()?);
            Some(flow(f + 1_000))
        }

        fn replicated_state(&self, key: &FlowBytes) -> Option<Vec<u8>> {
            count_state(&self.counts, key)
        }

        fn install_replicated(&mut self, key: &FlowBytes, state: Option<&[u8]>, _: u64) -> bool {
            install_count(&mut self.counts, key, state)
        }
    }

    /// A count per flow (the packet's input port) that the test may change between
    /// bursts, as a control plane edits a table: port 0's packets count, the others only
    /// read. Each output shows the count it saw.
    #[derive(Default)]
    struct Edited {
        counts: Arc<std::sync::Mutex<FlowMap<FlowBytes, u64>>>,
    }

    impl Program for Edited {
        type Prepared = ();

        fn process(&mut self, burst: &mut Burst, _ctx: &mut Context) {
            let mut counts = self.counts.lock().unwrap();
            for p in burst.iter_mut() {
                let count = counts.entry(flow(0)).or_default();
                *count += u64::from(p.desc.in_port == 0);
                p.data[..8].copy_from_slice(&count.to_le_bytes());
                p.desc.verdict = Verdict::Forward(0);
            }
        }

        fn replicated_key(
            &self,
            _: &stateplane_runtime::PacketDesc,
            _: &[u8],
        ) -> Option<FlowBytes> {
            Some(flow(0))
        }

        fn replicated_state(&self, key: &FlowBytes) -> Option<Vec<u8>> {
            count_state(&self.counts.lock().unwrap(), key)
        }

        fn install_replicated(&mut self, key: &FlowBytes, state: Option<&[u8]>, _: u64) -> bool {
            install_count(&mut self.counts.lock().unwrap(), key, state)
        }
    }

    type EditedCounts = Arc<std::sync::Mutex<FlowMap<FlowBytes, u64>>>;

    /// A worker running [`Edited`] on a memory store, the store's answers let through, and
    /// the counts the test edits; flow 0 counted once (by packet 1, which left).
    fn edited_worker() -> (
        Worker,
        Arc<AtomicBool>,
        Arc<ReplicationCounters>,
        EditedCounts,
        MemoryStore<FlowBytes>,
    ) {
        let counts = EditedCounts::default();
        let program = Edited {
            counts: Arc::clone(&counts),
        };
        let store = MemoryStore::new(StoreConfig::default());
        let (mut w, open, counters, _) =
            worker_on(Box::new(program), &store, ReplicaConfig::default());
        open.store(true, Ordering::Relaxed);
        let mut b = burst(&[(0, 1)]);
        w.handle(&mut b);
        assert_eq!(out(&b), [(0, 1, 1)]);
        (w, open, counters, counts, store)
    }

    /// Handles `packets` with the store's answers held back, where nothing of them may
    /// leave (`why`); then lets the answers through: what leaves with the next burst.
    fn held_for_the_store(
        w: &mut Worker,
        open: &AtomicBool,
        packets: &[(u16, u64)],
        why: &str,
    ) -> Vec<(u16, u64, u64)> {
        open.store(false, Ordering::Relaxed);
        let mut b = burst(packets);
        w.handle(&mut b);
        assert!(out(&b).is_empty(), "{why}");
        open.store(true, Ordering::Relaxed);
        let mut b = Burst::with_capacity(64);
        w.handle(&mut b);
        out(&b)
    }

    /// A flow's state changed between bursts (a control-plane edit) is written by the
    /// flow's next packet, though that packet only reads it, and its output waits for the
    /// write: no output shows a state the store does not have. A read that changes
    /// nothing writes nothing.
    #[test]
    fn a_state_edited_between_bursts_is_written_by_the_next_packet_that_reads_it() {
        let (mut w, open, counters, counts, store) = edited_worker();
        assert_eq!(counters.writes.load(Ordering::Relaxed), 1);
        let mut b = burst(&[(1, 2)]);
        w.handle(&mut b);
        assert_eq!(out(&b), [(1, 2, 1)]);
        assert_eq!(
            counters.writes.load(Ordering::Relaxed),
            1,
            "a read writes nothing"
        );
        // Edited between bursts; the next packet, a read, waits for its write.
        counts.lock().unwrap().insert(flow(0), 100);
        let left = held_for_the_store(
            &mut w,
            &open,
            &[(1, 3)],
            "the read waits for the edit's write",
        );
        assert_eq!(left, [(1, 3, 100)]);
        assert_eq!(counters.writes.load(Ordering::Relaxed), 2);
        let stored = store.read(&flow(0)).and_then(|(_, v)| v);
        assert_eq!(stored, Some(100u64.to_le_bytes().to_vec()));
    }

    /// A burst's later packets of a flow are released as its first one is: all at once
    /// when nothing changed, all held behind the write when the first read found the
    /// state edited, and when a later one changes it (the burst's one write carries the
    /// flow's state after it, which the outputs before it wait for too).
    #[test]
    fn a_bursts_packets_of_one_flow_leave_as_its_first_one_does() {
        let (mut w, open, counters, counts, _store) = edited_worker();
        // Reads of an unchanged state: all leave at once.
        let mut b = burst(&[(1, 2), (1, 3), (1, 4)]);
        w.handle(&mut b);
        assert_eq!(out(&b), [(1, 2, 1), (1, 3, 1), (1, 4, 1)]);
        // Edited: every read waits for the write, not only the first.
        counts.lock().unwrap().insert(flow(0), 100);
        let reads = [(1, 5), (1, 6), (1, 7)];
        let left = held_for_the_store(&mut w, &open, &reads, "the reads wait for the edit's write");
        assert_eq!(left, [(1, 5, 100), (1, 6, 100), (1, 7, 100)]);
        // Reads, then a count: the burst's write carries the count, and all wait for it.
        let packets = [(1, 8), (1, 9), (0, 10)];
        let left = held_for_the_store(
            &mut w,
            &open,
            &packets,
            "the reads wait for the count's write",
        );
        assert_eq!(left, [(1, 8, 100), (1, 9, 100), (0, 10, 101)]);
        assert_eq!(counters.writes.load(Ordering::Relaxed), 3);
    }

    fn worker(park_timeout_ns: u64) -> (Worker, Arc<AtomicBool>, Arc<ReplicationCounters>) {
        worker_of(Box::new(Tally::default()), park_timeout_ns)
    }

    fn worker_of(
        program: Box<dyn Running>,
        park_timeout_ns: u64,
    ) -> (Worker, Arc<AtomicBool>, Arc<ReplicationCounters>) {
        let store = MemoryStore::new(StoreConfig {
            min_lease_ns: 100_000_000,
            max_lease_ns: 60_000_000_000,
            fencing: true,
            ..StoreConfig::default()
        });
        let config = ReplicaConfig {
            park_timeout_ns,
            ..ReplicaConfig::default()
        };
        let (worker, open, counters, _) = worker_on(program, &store, config);
        (worker, open, counters)
    }

    /// A worker running `program` on `store` (its answers gated), and the requests it
    /// sends.
    fn worker_on(
        program: Box<dyn Running>,
        store: &MemoryStore<FlowBytes>,
        config: ReplicaConfig,
    ) -> (Worker, Arc<AtomicBool>, Arc<ReplicationCounters>, Sent) {
        let (link, open, sent) = Gated::on(store);
        let holder = Holder {
            switch: 1 << 8,
            incarnation: 1,
        };
        let counters = Arc::new(ReplicationCounters::default());
        let stage = ReplicationStage::new(
            Replica::new(holder, config),
            config,
            Box::new(link),
            Arc::clone(&counters),
            None,
        );
        let worker = Worker::new(program, 0, 1, 3, FlowHasher::with_seed(7))
            .with_state_stages(vec![Box::new(stage)]);
        (worker, open, counters, sent)
    }

    /// A burst of packets (input port, sequence number), each 64 bytes.
    fn burst(packets: &[(u16, u64)]) -> Burst {
        let mut b = Burst::with_capacity(64);
        for &(port, seq) in packets {
            assert!(b.push(&[0; 64], 64, seq, port, seq));
        }
        b
    }

    /// What left in a burst: (flow, sequence number, the count it showed).
    fn out(b: &Burst) -> Vec<(u16, u64, u64)> {
        (b.iter())
            .filter(|(d, _)| d.verdict == Verdict::Forward(0))
            .map(|(d, data)| {
                let count = u64::from_le_bytes(data[..8].try_into().unwrap());
                (d.in_port, d.seq, count)
            })
            .collect()
    }

    /// A run from a capture waits for the store once 4,096 packets wait for it, however
    /// large the park bound: a deeper queue at the store makes requests reach it late for
    /// their leases.
    #[test]
    fn the_worker_is_backlogged_once_4096_packets_wait_for_the_store() {
        let store = MemoryStore::new(StoreConfig::default());
        let config = ReplicaConfig {
            park_limit: 65_536,
            ..ReplicaConfig::default()
        };
        let (mut w, _open, _, _) = worker_on(Box::new(Tally::default()), &store, config);
        // Flows (input ports) of their own, none granted: every packet waits.
        let mut port = 0u16;
        while w.holding() < BACKLOG - 64 {
            let packets: Vec<(u16, u64)> = (0..64).map(|i| (port + i, 1)).collect();
            port += 64;
            w.handle(&mut burst(&packets));
        }
        assert!(!w.backlogged(), "{} wait", w.holding());
        let packets: Vec<(u16, u64)> = (0..64).map(|i| (port + i, 1)).collect();
        w.handle(&mut burst(&packets));
        assert_eq!(w.holding(), BACKLOG);
        assert!(
            w.backlogged(),
            "far below half the park bound, at the backlog"
        );
    }

    /// The parking place is bounded in bytes as well as packets: jumbo frames fill it at
    /// `parked_bytes(park_limit)`, far below `park_limit` of them, and what does not fit
    /// is dropped and counted.
    #[test]
    fn jumbo_frames_fill_the_parking_place_by_its_bytes() {
        let store = MemoryStore::new(StoreConfig::default());
        let config = ReplicaConfig {
            park_limit: 64,
            ..ReplicaConfig::default()
        };
        let (mut w, _open, counters, _) = worker_on(Box::new(Tally::default()), &store, config);
        let mut sent = 0u64;
        for port in 0..40u16 {
            let mut b = Burst::with_capacity(4);
            assert!(b.push(&[0; 9000], 9000, 1, port, 1));
            w.handle(&mut b);
            sent += 1;
        }
        let fits = parked_bytes(64) / 9000;
        assert_eq!(
            w.holding(),
            fits,
            "no lease: every packet waits, as many as fit"
        );
        let dropped = counters.dropped.load(Ordering::Relaxed);
        assert_eq!(
            w.holding() as u64 + dropped,
            sent,
            "the rest dropped and counted"
        );
    }

    #[test]
    fn held_packets_leave_in_later_bursts_in_their_flows_order() {
        let (mut w, open, counters) = worker(60_000_000_000);
        // No lease yet: every packet is held, none processed, and the worker goes on.
        let mut b = burst(&[(0, 1), (0, 2), (1, 3), (0, 4)]);
        w.handle(&mut b);
        assert!(b.is_empty());
        assert_eq!((w.holding(), w.stats.get(Counter::RxPackets)), (4, 0));
        let mut b = burst(&[(1, 5), (0, 6)]);
        w.handle(&mut b);
        assert!(b.is_empty());
        assert_eq!(w.holding(), 6);
        // The leases come: the held packets are processed first, in order, with the next
        // burst's; their writes' answers come at once, so all leave in it.
        open.store(true, Ordering::Relaxed);
        let mut b = burst(&[(1, 7), (0, 8)]);
        w.handle(&mut b);
        let left = out(&b);
        let of_flow = |port: u16| -> Vec<(u64, u64)> {
            (left.iter())
                .filter(|o| o.0 == port)
                .map(|o| (o.1, o.2))
                .collect()
        };
        assert_eq!(of_flow(0), [(1, 1), (2, 2), (4, 3), (6, 4), (8, 5)]);
        assert_eq!(of_flow(1), [(3, 1), (5, 2), (7, 3)]);
        assert_eq!(w.holding(), 0);
        // Writes unanswered: outputs wait, later packets of the flow are processed and
        // wait behind them; the answers let them all out, in order, behind the next
        // burst's own (a flow with nothing held leaves in its place).
        open.store(false, Ordering::Relaxed);
        let mut b = burst(&[(0, 9), (0, 10)]);
        w.handle(&mut b);
        assert!(out(&b).is_empty());
        let mut b = burst(&[(0, 11)]);
        w.handle(&mut b);
        assert!(out(&b).is_empty());
        assert_eq!(w.holding(), 3);
        open.store(true, Ordering::Relaxed);
        let mut b = burst(&[(1, 12), (0, 13)]);
        w.handle(&mut b);
        assert_eq!(
            out(&b),
            [(1, 12, 4), (0, 9, 6), (0, 10, 7), (0, 11, 8), (0, 13, 9)]
        );
        assert_eq!(w.holding(), 0);
        assert_eq!(w.stats.get(Counter::TxPackets), 13);
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 0);
        assert!(counters.held_most.load(Ordering::Relaxed) >= 6);
    }

    /// A value per flow (the packet's input port), one more for each packet whose ninth
    /// byte is 1 (the others only read it), written into each packet's first eight bytes:
    /// each output shows the state it saw. It checks its flows' leases as a program whose
    /// table does ([`Running::check_leases`]): a packet the stage did not admit is
    /// processed only under its flow's mark, and its flow's value then is kept to compare.
    /// A packet from port 100 + f reads flow f, naming it by alias (f + 1,000) while f
    /// has no value here, as `nat`'s answers do.
    #[derive(Default)]
    struct Gauge {
        values: FlowMap<FlowBytes, u64>,
        marks: FlowMap<FlowBytes, u64>,
        clock: u64,
        checking: bool,
        /// Packets found under their mark: flow, place, value then.
        reads: Vec<(FlowBytes, u16, u64)>,
        /// How many were, in all.
        found: Arc<AtomicU64>,
    }

    impl Program for Gauge {
        type Prepared = ();

        fn process(&mut self, burst: &mut Burst, _ctx: &mut Context) {
            for p in burst.iter_mut() {
                let key = flow(p.desc.in_port % 100);
                if self.checking
                    && let Some(place) = p.desc.lease_check
                {
                    let marked = self.values.contains_key(&key)
                        && (self.marks.get(&key)).is_some_and(|&until| self.clock < until);
                    if !marked {
                        p.desc.verdict = Verdict::Drop(DropReason::NOT_LEASED);
                        continue;
                    }
                    let value = self.values.get(&key).copied().unwrap_or(0);
                    self.reads.push((key, place, value));
                }
                let value = self.values.entry(key).or_default();
                *value += u64::from(p.data[8] == 1);
                p.data[..8].copy_from_slice(&value.to_le_bytes());
                p.desc.verdict = Verdict::Forward(0);
            }
        }

        fn replicated_key(
            &self,
            packet: &stateplane_runtime::PacketDesc,
            _: &[u8],
        ) -> Option<FlowBytes> {
            let key = flow(packet.in_port % 100);
            (packet.in_port < 100 || self.values.contains_key(&key)).then_some(key)
        }

        fn replicated_alias(
            &self,
            packet: &stateplane_runtime::PacketDesc,
            _: &[u8],
        ) -> Option<FlowBytes> {
            let f = packet.in_port % 100;
            (packet.in_port >= 100 && !self.values.contains_key(&flow(f))).then(|| flow(f + 1_000))
        }

        fn replicated_alias_of(&self, key: &FlowBytes) -> Option<FlowBytes> {
            let f = u16::from_be_bytes(key.as_bytes().try_into().ok()?);
            Some(flow(f + 1_000))
        }

        fn replicated_state(&self, key: &FlowBytes) -> Option<Vec<u8>> {
            count_state(&self.values, key)
        }

        fn install_replicated(&mut self, key: &FlowBytes, state: Option<&[u8]>, _: u64) -> bool {
            self.marks.remove(key);
            install_count(&mut self.values, key, state)
        }

        fn check_leases(&mut self) -> bool {
            self.checking = true;
            true
        }

        fn mark_leased(&mut self, key: &FlowBytes, until_ns: Option<u64>) {
            match until_ns {
                Some(until) => self.marks.insert(*key, until),
                None => self.marks.remove(key),
            };
        }

        fn set_lease_clock(&mut self, now_ns: u64) {
            self.clock = now_ns;
        }

        fn clear_leases(&mut self) {
            self.marks.clear();
        }

        fn take_leased_changes(&mut self, every: bool, out: &mut Vec<LeasedPacket>) -> u64 {
            let values = &self.values;
            let changed = |flow: &FlowBytes| {
                (self.reads.iter()).any(|(f, _, then)| f == flow && values.get(f) != Some(then))
            };
            for &(flow, place, _) in &self.reads {
                let changed = changed(&flow);
                if every || changed {
                    out.push(LeasedPacket {
                        flow,
                        place,
                        changed,
                    });
                }
            }
            let found = self.reads.len() as u64;
            self.found.fetch_add(found, Ordering::Relaxed);
            self.reads.clear();
            found
        }
    }

    /// A program that checks its flows' leases, on random bursts over 16 flows, one
    /// packet in 32 changing its flow, with the store's answers held back for a few
    /// bursts at a time and leases short enough to come due: no output shows a value the
    /// store had not acknowledged when it left; each flow's outputs leave in order, each
    /// packet processed once (it shows its flow's changes up to it); every packet leaves,
    /// none dropped; and most were processed under their flow's mark, with nothing asked
    /// of the replica before the program.
    #[test]
    fn a_program_that_checks_leases_lets_out_only_what_the_store_acknowledged() {
        const FLOWS: usize = 16;
        let store = MemoryStore::new(StoreConfig {
            min_lease_ns: 1_000_000,
            max_lease_ns: 60_000_000_000,
            fencing: true,
            ..StoreConfig::default()
        });
        let config = ReplicaConfig {
            lease_ns: 40_000_000,
            margin_ns: 1_000_000,
            park_timeout_ns: 60_000_000_000,
            ..ReplicaConfig::default()
        };
        let found = Arc::new(AtomicU64::new(0));
        let gauge = Gauge {
            found: Arc::clone(&found),
            ..Gauge::default()
        };
        let (mut w, open, counters, _) = worker_on(Box::new(gauge), &store, config);
        let stored = |port: u16| {
            let state = store.read(&flow(port)).and_then(|(_, v)| v);
            state.map_or(0, |v| u64::from_le_bytes(v[..8].try_into().unwrap()))
        };
        let mut rng = 11u64;
        let mut next = move |n: u64| {
            rng = rng
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (rng >> 33) % n
        };
        // Per packet (by its sequence number): its flow's value once it is processed.
        let mut expected = std::collections::HashMap::new();
        let mut value = [0u64; FLOWS];
        let mut acked = [0u64; FLOWS];
        let mut last_seq = [0u64; FLOWS];
        let (mut seq, mut left, mut shut_for) = (0u64, 0u64, 0);
        for round in 0..3_000 {
            let gate = shut_for >= 3 || round >= 2_900 || next(10) < 6;
            shut_for = if gate { 0 } else { shut_for + 1 };
            open.store(gate, Ordering::Relaxed);
            if next(50) == 0 {
                std::thread::sleep(Duration::from_millis(next(4) + 1));
            }
            let mut b = Burst::with_capacity(64);
            // Up to a full burst: held outputs may then wait for room behind the burst's own.
            let n = if round >= 2_900 { 0 } else { next(65) };
            for _ in 0..n {
                seq += 1;
                let port = next(FLOWS as u64) as u16;
                let changes = next(32) == 0;
                let mut data = [0u8; 64];
                data[8] = u8::from(changes);
                value[usize::from(port)] += u64::from(changes);
                expected.insert(seq, value[usize::from(port)]);
                assert!(b.push(&data, 64, seq, port, seq));
            }
            w.handle(&mut b);
            w.tick_stages();
            for (port, seq, shown) in out(&b) {
                let p = usize::from(port);
                let bound = if gate { stored(port) } else { acked[p] };
                assert!(
                    shown <= bound,
                    "round {round}: packet {seq} of flow {port} left showing {shown}, the store acknowledged {bound}"
                );
                assert_eq!(
                    Some(&shown),
                    expected.get(&seq),
                    "round {round}: packet {seq}"
                );
                assert!(seq > last_seq[p], "round {round}: flow {port} out of order");
                last_seq[p] = seq;
                left += 1;
            }
            if gate {
                acked = std::array::from_fn(|p| stored(p as u16));
            }
        }
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 0, "{counters:?}");
        assert_eq!((left, w.holding()), (seq, 0), "every packet left");
        let processed = counters.processed.load(Ordering::Relaxed);
        assert_eq!(processed, seq, "each packet counted once as processed");
        let found = found.load(Ordering::Relaxed);
        assert!(
            found > seq / 2,
            "{found} of {seq} packets processed under their mark"
        );
    }

    /// Held packets whose lease came go through in the room their flows' left packets
    /// free, though every burst comes full (as a capture's do): the stage holds no more
    /// than it held when the store answered, and none once bursts leave room; each
    /// flow's packets leave in order.
    #[test]
    fn held_packets_go_through_in_the_room_left_packets_free_though_every_burst_is_full() {
        let store = MemoryStore::new(StoreConfig::default());
        let gauge = Gauge {
            checking: true,
            ..Gauge::default()
        };
        let (mut w, open, counters, _) =
            worker_on(Box::new(gauge), &store, ReplicaConfig::default());
        let (mut seq, mut left) = (0u64, 0u64);
        let mut last_seq = [0u64; 4];
        let mut round = |w: &mut Worker, size: u64| {
            let packets: Vec<(u16, u64)> = (0..size)
                .map(|_| {
                    seq += 1;
                    ((seq % 4) as u16, seq)
                })
                .collect();
            let mut b = burst(&packets);
            w.handle(&mut b);
            w.tick_stages();
            for (port, seq, _) in out(&b) {
                let p = usize::from(port);
                assert!(seq > last_seq[p], "flow {port} out of order");
                last_seq[p] = seq;
                left += 1;
            }
            seq
        };
        // The store answers nothing: each flow's packets wait for its lease.
        for _ in 0..3 {
            round(&mut w, 64);
        }
        let when_answered = w.holding();
        assert_eq!(when_answered, 3 * 64);
        open.store(true, Ordering::Relaxed);
        for r in 0..50 {
            round(&mut w, 64);
            assert!(
                w.holding() <= when_answered,
                "full burst {r}: {} held, {when_answered} when the store answered",
                w.holding()
            );
        }
        for _ in 0..20 {
            round(&mut w, 16);
        }
        let sent = round(&mut w, 0);
        assert_eq!((left, w.holding()), (sent, 0), "every packet left");
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 0, "{counters:?}");
    }

    /// A program that checks its flows' leases meets flows another switch made only by
    /// packets that read them, the first of each named by its alias: each such packet is
    /// held while the store names its flow, its flow's later packets (known here by then)
    /// wait behind it, and every packet leaves, in its flow's order, showing the value the
    /// other switch left, though every burst comes full.
    #[test]
    fn packets_known_first_by_their_alias_leave_in_order_with_the_state_they_find() {
        const FLOWS: u16 = 4;
        let store = MemoryStore::new(StoreConfig {
            min_lease_ns: 1_000_000,
            ..StoreConfig::default()
        });
        let config = ReplicaConfig {
            lease_ns: 20_000_000,
            margin_ns: 1_000_000,
            ..ReplicaConfig::default()
        };
        // Switch A makes each flow's value 3.
        let (mut a, open, _, _) = worker_on(Box::new(Gauge::default()), &store, config);
        open.store(true, Ordering::Relaxed);
        for seq in 0..3 * u64::from(FLOWS) {
            let mut data = [0u8; 64];
            data[8] = 1;
            let mut b = Burst::with_capacity(64);
            assert!(b.push(&data, 64, seq, (seq % 4) as u16, seq));
            a.handle(&mut b);
        }
        let start = std::time::Instant::now();
        while a.holding() > 0 {
            assert!(start.elapsed() < Duration::from_secs(5), "A never drained");
            a.handle(&mut Burst::with_capacity(64));
            a.tick_stages();
        }
        drop(a);
        // Switch B sees only readers, in full bursts, from before A's leases pass.
        let gauge = Gauge {
            checking: true,
            ..Gauge::default()
        };
        let (mut w, open, counters, _) = worker_on(Box::new(gauge), &store, config);
        open.store(true, Ordering::Relaxed);
        let (mut seq, mut left) = (0u64, 0u64);
        let mut last_seq = [0u64; FLOWS as usize];
        let start = std::time::Instant::now();
        while left < seq || seq == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{left} of {seq} left"
            );
            let mut b = Burst::with_capacity(64);
            let more = start.elapsed() < Duration::from_millis(60);
            while more && b.len() < 64 {
                seq += 1;
                assert!(b.push(&[0; 64], 64, seq, 100 + (seq % 4) as u16, seq));
            }
            w.handle(&mut b);
            w.tick_stages();
            for (port, seq, shown) in out(&b) {
                let f = usize::from(port % 100);
                assert_eq!(shown, 3, "packet {seq} of flow {f}");
                assert!(seq > last_seq[f], "flow {f} out of order at {seq}");
                last_seq[f] = seq;
                left += 1;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 0, "{counters:?}");
        assert_eq!(counters.resolves.load(Ordering::Relaxed), u64::from(FLOWS));
    }

    /// A packet named by an alias no flow has at the store waits for the packets that
    /// came before it: one of them, held for its lease, opens its flow here, and the
    /// packet is then admitted by that flow, behind it (never processed as of no flow
    /// while the program has its flow: its count would leave with no write behind it).
    /// One whose flow nothing opens is processed as of no flow, and sees none.
    #[test]
    fn a_packet_whose_alias_names_no_flow_waits_for_those_before_it_then_sees_no_state() {
        let (mut w, open, counters) = worker_of(Box::new(Opened::default()), 60_000_000_000);
        // Flow 1 opened (held for its lease), then a read by alias (held for the store).
        let mut b = burst(&[(0, 10)]);
        w.handle(&mut b);
        let mut b = burst(&[(1, 11)]);
        w.handle(&mut b);
        assert!(b.is_empty());
        assert_eq!(w.holding(), 2);
        open.store(true, Ordering::Relaxed);
        let mut left = Vec::new();
        for _ in 0..3 {
            let mut b = Burst::with_capacity(64);
            w.handle(&mut b);
            left.extend(out(&b));
        }
        assert_eq!(
            left,
            [(0, 10, 1), (1, 11, 1)],
            "the read behind the opening"
        );
        let of_flows = || counters.processed.load(Ordering::Relaxed);
        assert_eq!(of_flows(), 2, "both as packets of flow 1");
        // A read of flow 2, which nothing opens: no state.
        let mut b = burst(&[(1, 21)]);
        w.handle(&mut b);
        let mut b2 = Burst::with_capacity(64);
        w.handle(&mut b2);
        let left: Vec<_> = out(&b).into_iter().chain(out(&b2)).collect();
        assert_eq!(left, [(1, 21, 0)]);
        assert_eq!(of_flows(), 2, "the read of flow 2 as of no flow");
        // Flow 3 opened and read in one burst, the store answering at once: the read,
        // its alias unknown to the store, waits for the opening in its own burst.
        let mut left = Vec::new();
        let mut b = burst(&[(0, 30), (1, 31)]);
        w.handle(&mut b);
        left.extend(out(&b));
        let mut b = Burst::with_capacity(64);
        w.handle(&mut b);
        left.extend(out(&b));
        assert_eq!(left, [(0, 30, 1), (1, 31, 1)]);
        assert_eq!(of_flows(), 4);
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 0);
    }

    /// A flow taken over from the store with its state names its alias at once, not at
    /// its next write: a switch that only reads it renews the alias with it (else the
    /// alias would expire at the store while the flow lives on, and its answers at a third
    /// switch would find nothing).
    #[test]
    fn a_flow_taken_over_renews_its_alias_though_it_only_reads() {
        const MS: u64 = 1_000_000;
        let store = MemoryStore::new(StoreConfig {
            min_lease_ns: MS,
            ..StoreConfig::default()
        });
        // Another switch wrote flow 1 (count 5) with its alias, and its lease passed.
        let (key, alias) = (flow(1), flow(1_001));
        let mut theirs = store.link();
        let them = Holder {
            switch: 9,
            incarnation: 1,
        };
        let mut replies = Vec::new();
        theirs.send(
            them,
            &mut vec![Request::Acquire {
                key,
                lease_ns: MS,
                nonce: 1,
            }],
        );
        theirs.send(
            them,
            &mut vec![Request::Write {
                key,
                epoch: 1,
                seq: 1,
                value: 5u64.to_le_bytes().to_vec(),
                lease_ns: MS,
                keep_ns: stateplane_replication::protocol::KEEP_FOREVER,
                alias: Some(alias),
            }],
        );
        theirs.receive(&mut replies);
        assert!(matches!(
            replies[..],
            [Reply::Granted { .. }, Reply::Written { .. }]
        ));
        std::thread::sleep(Duration::from_millis(5));
        let config = ReplicaConfig {
            lease_ns: 100 * MS,
            ..ReplicaConfig::default()
        };
        let (mut w, open, _, sent) = worker_on(Box::new(Opened::default()), &store, config);
        open.store(true, Ordering::Relaxed);
        // Reads by key, one every 10 ms: the lease is renewed halfway, with the alias.
        let mut left = Vec::new();
        let renewed_with_alias = |sent: &Sent| {
            (sent.lock().unwrap().iter())
                .any(|q| matches!(q, Request::Renew { key: k, alias: Some(a), .. } if *k == key && *a == alias))
        };
        let start = Instant::now();
        while !renewed_with_alias(&sent) {
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "{:?}",
                sent.lock().unwrap()
            );
            let mut b = burst(&[(2, 10)]);
            w.handle(&mut b);
            left.extend(out(&b));
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(left.iter().all(|&(_, _, count)| count == 5), "{left:?}");
        assert!(
            !(sent.lock().unwrap().iter()).any(|q| matches!(q, Request::Write { .. })),
            "it only read"
        );
    }

    #[test]
    fn a_reload_drops_what_waits_for_the_old_instance_and_the_flows_go_on_from_the_store() {
        let (mut w, open, counters) = worker(60_000_000_000);
        open.store(true, Ordering::Relaxed);
        let mut b = burst(&[(0, 1)]);
        w.handle(&mut b);
        assert_eq!(out(&b), [(0, 1, 1)]);
        // Flow 0's next outputs wait for their write; flow 1's packet for its lease.
        open.store(false, Ordering::Relaxed);
        let mut b = burst(&[(0, 2), (1, 3), (0, 4)]);
        w.handle(&mut b);
        assert!(b.is_empty());
        assert_eq!(w.holding(), 3);
        // A reload: nothing held for the old instance may leave (its leases start over);
        // each leaves as a drop, counted, with the next bursts.
        w.replace_program(Box::new(Tally::default()), || Box::new(Tally::default()));
        let mut b = Burst::with_capacity(64);
        w.handle(&mut b);
        assert_eq!(w.holding(), 0);
        assert_eq!(b.len(), 3);
        assert!(out(&b).is_empty());
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 3);
        assert_eq!(w.stats.drops[usize::from(DropReason::UNREPLICATED.0)], 3);
        // The flows go on from the store: flow 0 took the lease again with its count.
        open.store(true, Ordering::Relaxed);
        let mut b = burst(&[(0, 5)]);
        w.handle(&mut b);
        let mut b2 = Burst::with_capacity(64);
        w.handle(&mut b2);
        let left: Vec<_> = out(&b).into_iter().chain(out(&b2)).collect();
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!((left[0].0, left[0].1), (0, 5));
        assert!(left[0].2 >= 2, "counts on from the store's: {left:?}");
    }

    #[test]
    fn packets_held_past_the_park_timeout_leave_as_drops_counted() {
        let (mut w, _shut, counters) = worker(1_000_000);
        let mut b = burst(&[(0, 1), (1, 2), (0, 3)]);
        w.handle(&mut b);
        assert!(b.is_empty());
        std::thread::sleep(Duration::from_millis(30));
        // The replica drops what waited too long; the drops ride in the next burst.
        let mut b = Burst::with_capacity(64);
        let start = Instant::now();
        while w.holding() > 0 {
            assert!(start.elapsed() < Duration::from_secs(5), "still held");
            b.clear();
            w.handle(&mut b);
        }
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 3);
        assert_eq!(w.stats.get(Counter::RxPackets), 3);
        assert_eq!(w.stats.get(Counter::Dropped), 3);
        assert_eq!(w.stats.drops[usize::from(DropReason::UNREPLICATED.0)], 3);
    }
}
