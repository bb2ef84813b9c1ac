//! The Redis store: a Redis 7 server (or later) keeps every replicated flow's record, and
//! the steps on it are the functions of `functions.lua`, loaded at each connection
//! (`FUNCTION LOAD REPLACE`), so that a lease, a fencing epoch and a sequenced write are
//! each one atomic call on the server's clock.
//!
//! A flow's record is the hash `PREFIX:{KEY}`, `KEY` the flow key's bytes in hex: the
//! braces make it the key's hash tag, so a Redis Cluster keeps each flow in one slot.
//!
//! A link is a thread with its own connection: it takes the batches its worker sends,
//! writes as many as are waiting in one pipeline (one round trip carries many flows'
//! requests, up to [`RedisConfig::batch`] of them in each function call), and hands the answers back through a channel, waking the worker through a
//! socket. With `wait`, each round trip that carries writes ends with `WAIT N TIMEOUT`
//! (on a cluster, to every master), and its writes are passed on only if N replicas (of
//! each master) have them.
//!
//! Must never: block the worker (a full queue drops the batch, counted: the replica sends
//! it again); stop on a lost server (the error is counted and logged once, the requests
//! of the failed round trip are left unanswered, and the link connects again).

use crate::redis_client::{self, Connector, RedisTls};
use crate::{LinkCounters, StoreKey, StoreLink, Value};
use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use stateplane_replication::protocol::KEEP_FOREVER;
use stateplane_replication::{Holder, Reply, Request};
use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The functions, as loaded into the server.
pub const FUNCTIONS: &str = include_str!("functions.lua");

/// The functions' version (`VERSION` in functions.lua), in the name of each a switch
/// calls: where switches of two versions share a store, the one whose functions were
/// replaced finds none of its own at its next call, rather than a function that misreads
/// its arguments or answers what it misreads.
pub const VERSION: u64 = 2;

/// The name of a step's function in this version: `stateplane_v2_batch`.
fn function(step: &str) -> String {
    format!("stateplane_v{VERSION}_{step}")
}

/// How long a connection may take, and a round trip.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Requests written in one pipeline at most.
const PIPELINE: usize = 4_096;
/// Batches a link holds for its thread before it drops them.
const QUEUE: usize = 4_096;

/// (No `Debug`: its URL may hold a password; [`redis_client::redacted`] shows it.)
#[derive(Clone)]
pub struct RedisConfig {
    pub url: String,
    /// Records are named `PREFIX:{KEY}`.
    pub prefix: String,
    /// Leases asked for are held to this range (microseconds are the server's unit).
    pub min_lease: Duration,
    pub max_lease: Duration,
    /// A record not touched this long is dropped by the server (flows long gone).
    pub retain: Duration,
    /// `WAIT`: a write is acknowledged once this many replicas have it (of every master,
    /// on a cluster), within the time.
    pub wait: Option<(u32, Duration)>,
    /// `url` is a node of a Redis Cluster: each flow's calls go to the master of its slot.
    pub cluster: bool,
    /// Requests carried by one function call at most (`stateplane_v2_batch`); 1 calls the
    /// single functions, one flow a call. A cluster makes one call a flow whatever this
    /// is (flows of one call must share a slot).
    pub batch: usize,
    /// With a `rediss://` URL: the certificates the connection trusts and shows (without
    /// them, the system's roots).
    pub tls: Option<RedisTls>,
    /// The setting that gives the CA, named when the server's certificate is not trusted.
    pub ca_setting: &'static str,
}

impl RedisConfig {
    pub fn new(url: &str) -> RedisConfig {
        RedisConfig {
            url: url.to_string(),
            prefix: "stateplane:rep".to_string(),
            min_lease: Duration::from_millis(100),
            max_lease: Duration::from_secs(60),
            retain: Duration::from_secs(3_600),
            wait: None,
            cluster: false,
            batch: 128,
            tls: None,
            ca_setting: "replication.tls_ca",
        }
    }
}

/// A connection to one server or to a cluster.
enum Conn {
    One(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

/// Connects to the server (or the cluster) and loads the functions (on every master of a
/// cluster); what fails says how to fix it. `nodes`: a cluster's nodes as last seen (asked
/// after the URL's, so that the link finds the cluster when that node is the one gone),
/// made the nodes it has now. `check_replicas`: say whether a master has fewer replicas
/// than `WAIT` asks for (once when the store starts and at each connection after an
/// outage, not at each worker's link).
fn connect(
    config: &RedisConfig,
    nodes: &mut Vec<String>,
    check_replicas: bool,
) -> Result<Conn, String> {
    if config.cluster {
        return connect_cluster(config, nodes, check_replicas);
    }
    let url = &config.url;
    let connector = Connector::new(url, config.tls.clone(), config.ca_setting)?;
    let mut conn = connector.connect(CONNECT_TIMEOUT)?;
    conn.set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|()| conn.set_write_timeout(Some(IO_TIMEOUT)))
        .map_err(|e| redis_client::explain(url, &e, config.ca_setting))?;
    redis_client::check_not_cluster(
        &mut conn,
        url,
        "set cluster = true ([replication]), so that each flow goes to its slot's master",
    )?;
    load_functions(&mut conn, url, config.ca_setting, "")?;
    redis_client::check_keeps_keys(&mut conn, url, KEPT)?;
    if check_replicas {
        warn_if_short_of_replicas(&mut conn, config);
    }
    Ok(Conn::One(conn))
}

/// Says, at each connection, when `WAIT` asks for more replicas than a master has
/// ([`redis_client::short_of_replicas`]).
fn warn_if_short_of_replicas(conn: &mut impl redis::ConnectionLike, config: &RedisConfig) {
    if let Some((wanted, _)) = config.wait
        && let Some(warning) = redis_client::short_of_replicas(conn, &config.url, wanted)
    {
        log::warn!("{warning}");
    }
}

/// What a store that evicts keys would lose ([`redis_client::check_keeps_keys`]).
const KEPT: &str = "flows' acknowledged states and leases";

fn connect_cluster(
    config: &RedisConfig,
    nodes: &mut Vec<String>,
    check_replicas: bool,
) -> Result<Conn, String> {
    let url = &config.url;
    let tls = config.tls.as_ref();
    let mut asked = vec![url.clone()];
    asked.extend(nodes.iter().filter(|n| *n != url).cloned());
    let client = redis_client::cluster_client(&asked, tls, CONNECT_TIMEOUT, IO_TIMEOUT)
        .map_err(|e| redis_client::explain(url, &e, config.ca_setting))?;
    let mut conn = client.get_connection().map_err(|e| {
        let why = redis_client::explain(url, &e, config.ca_setting);
        format!("{why} (is it a node of a running Redis Cluster?)")
    })?;
    load_functions(
        &mut conn,
        url,
        config.ca_setting,
        " on the cluster's masters",
    )?;
    redis_client::check_keeps_keys(&mut conn, url, KEPT)?;
    if check_replicas {
        warn_if_short_of_replicas(&mut conn, config);
    }
    // Its nodes, masters and replicas: after a failover, a replica is a master.
    if let Ok(slots) = redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn) {
        let seen = cluster_nodes(url, &slots);
        if !seen.is_empty() {
            *nodes = seen;
        }
    }
    Ok(Conn::Cluster(Box::new(conn)))
}

/// The nodes a `CLUSTER SLOTS` answer names (each range's master, then its replicas), as
/// URLs like `url`, each once.
fn cluster_nodes(url: &str, slots: &redis::Value) -> Vec<String> {
    let mut nodes: Vec<String> = Vec::new();
    let redis::Value::Array(ranges) = slots else {
        return nodes;
    };
    for range in ranges {
        let redis::Value::Array(fields) = range else {
            continue;
        };
        // Start, end, then one array a node: its address, port and id.
        for node in fields.iter().skip(2) {
            let redis::Value::Array(node) = node else {
                continue;
            };
            let host = match node.first() {
                Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                _ => continue,
            };
            let port = match node.get(1) {
                Some(redis::Value::Int(p)) => u16::try_from(*p).ok(),
                _ => None,
            };
            // A node with no address known ("" or "?") is asked by none.
            if let Some(at) = port
                .filter(|_| !host.is_empty() && host != "?")
                .and_then(|port| redis_client::at_address(url, &host, port))
                && !nodes.contains(&at)
            {
                nodes.push(at);
            }
        }
    }
    nodes
}

/// Loads the functions (`FUNCTION LOAD REPLACE`) on the server, or the cluster's masters
/// (`where_`); a refusal of unknown cause names the Redis version needed. Functions of a
/// newer version are left there and this switch refused (they serve the switches that
/// loaded them, and this one's calls would fight them); an older version's are replaced,
/// with a warning: the switches that loaded them are refused at their next call.
fn load_functions(
    conn: &mut impl redis::ConnectionLike,
    url: &str,
    ca_setting: &str,
    where_: &str,
) -> Result<(), String> {
    let loaded = redis::cmd("FCALL")
        .arg("stateplane_version")
        .arg(0)
        .query::<u64>(conn)
        .ok();
    // Before versions were named, the library had no `stateplane_version`.
    let older = match loaded {
        Some(version) if version > VERSION => {
            return Err(format!(
                "the store{where_} holds the replication functions of a newer stateplane \
                 (version {version}; this switch's are version {VERSION}), loaded by a \
                 switch sharing it: run this switch at that switch's version (switches of \
                 two versions cannot share a store)"
            ));
        }
        Some(version) if version < VERSION => Some(format!("version {version}")),
        Some(_) => None,
        None => redis::cmd("FUNCTION")
            .arg("LIST")
            .arg("LIBRARYNAME")
            .arg("stateplane_replication")
            .query::<Vec<redis::Value>>(conn)
            .is_ok_and(|libraries| !libraries.is_empty())
            .then(|| "from before versions were named".to_string()),
    };
    if let Some(older) = older {
        log::warn!(
            "Redis store {}: replacing an older stateplane's replication functions{where_} \
             ({older}) with version {VERSION}: switches of that version sharing the store \
             are refused at their next call; run them at this version",
            redis_client::redacted(url)
        );
    }
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(FUNCTIONS)
        .query::<redis::Value>(conn)
        .map(|_| ())
        .map_err(|e| {
            let version = Some("Redis 7 or later is needed: FUNCTION LOAD");
            let why = redis_client::explain_or(url, &e, ca_setting, version);
            format!("loading the replication functions{where_} failed: {why}")
        })
}

/// A Redis store, its server checked; [`RedisStore::link`] makes a worker's link.
pub struct RedisStore {
    config: Arc<RedisConfig>,
}

impl RedisStore {
    /// Connects once, so that a wrong URL, a server not running or one too old is refused
    /// before the switch starts.
    pub fn connect(config: RedisConfig) -> Result<RedisStore, String> {
        if config.min_lease.is_zero() || config.min_lease > config.max_lease {
            return Err(format!(
                "the lease range {:?}..{:?} is empty: give a minimum above 0 and at most the maximum",
                config.min_lease, config.max_lease
            ));
        }
        let sentinel = [
            redis_client::SENTINEL_SCHEME,
            redis_client::SENTINEL_TLS_SCHEME,
        ];
        if config.cluster && sentinel.iter().any(|s| config.url.starts_with(s)) {
            return Err(
                "a Redis Cluster is not reached through Sentinel: name one of its nodes \
                 (redis://HOST:PORT/), or leave cluster out"
                    .into(),
            );
        }
        if config.retain < config.max_lease * 10 {
            return Err(format!(
                "a retention of {:?} is shorter than ten leases of {:?}: a record must outlive \
                 every lease that can matter",
                config.retain, config.max_lease
            ));
        }
        connect(&config, &mut Vec::new(), true)?;
        Ok(RedisStore {
            config: Arc::new(config),
        })
    }

    pub fn link<K: StoreKey>(&self) -> Result<RedisLink<K>, String> {
        let (to_thread, batches) = crossbeam_channel::bounded(QUEUE);
        let (answer, answers) = crossbeam_channel::unbounded();
        let (wake, wake_writer) =
            UnixStream::pair().map_err(|e| format!("a link's socket: {e}"))?;
        wake.set_nonblocking(true)
            .and_then(|()| wake_writer.set_nonblocking(true))
            .map_err(|e| format!("a link's socket: {e}"))?;
        let shared = Arc::new(Shared::default());
        let stop = Arc::new(AtomicBool::new(false));
        let outstanding = Arc::new(Mutex::new(HashSet::new()));
        let thread = {
            let (config, shared, stop, outstanding) = (
                Arc::clone(&self.config),
                Arc::clone(&shared),
                Arc::clone(&stop),
                Arc::clone(&outstanding),
            );
            std::thread::Builder::new()
                .name("redis-store".into())
                .spawn(move || {
                    let mut worker = LinkThread {
                        config,
                        conn: None,
                        shared,
                        outstanding,
                        answer,
                        wake: wake_writer,
                        outage_logged: None,
                        nodes: Vec::new(),
                    };
                    worker.run(&batches, &stop);
                })
                .map_err(|e| format!("the Redis link's thread: {e}"))?
        };
        Ok(RedisLink {
            to_thread: Some(to_thread),
            answers,
            wake,
            shared,
            outstanding,
            requests: 0,
            dropped: 0,
            stop,
            thread: Some(thread),
        })
    }
}

/// A request as the thread carries it: the key's record name made, the key kept to
/// answer with.
struct Outgoing<K> {
    holder: Holder,
    request: Request<K, Value>,
}

/// A request as sent again names it (its kind, its flow, the write's sequence number or
/// the ask's nonce, the lease's epoch): a replica sends the same request again when its
/// answer is late, and over a connection that loses nothing, an answer is late because
/// the request still waits its turn (a busy store), so it is not queued a second time.
/// A round trip that fails takes its requests out, so that the replica's next sending
/// goes.
type Sent<K> = (u8, K, u64, u64);

fn sent<K: Copy>(request: &Request<K, Value>) -> Sent<K> {
    match *request {
        Request::Acquire { key, nonce, .. } => (0, key, nonce, 0),
        Request::Write {
            key, seq, epoch, ..
        } => (1, key, seq, epoch),
        Request::Renew {
            key, nonce, epoch, ..
        } => (2, key, nonce, epoch),
        Request::Resolve { alias, nonce } => (3, alias, nonce, 0),
    }
}

/// Requests queued or on the connection, not yet answered.
type Outstanding<K> = Arc<Mutex<HashSet<Sent<K>>>>;

#[derive(Default)]
struct Shared {
    answers: AtomicU64,
    round_trips: AtomicU64,
    dropped: AtomicU64,
    errors: AtomicU64,
    reconnects: AtomicU64,
    short_of_replicas: AtomicU64,
    connected: AtomicU64,
    repeats_held: AtomicU64,
}

pub struct RedisLink<K> {
    to_thread: Option<Sender<Vec<Outgoing<K>>>>,
    answers: Receiver<Reply<K, Value>>,
    wake: UnixStream,
    shared: Arc<Shared>,
    outstanding: Outstanding<K>,
    requests: u64,
    dropped: u64,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<K: StoreKey> StoreLink<K> for RedisLink<K> {
    fn send(&mut self, holder: Holder, requests: &mut Vec<Request<K, Value>>) {
        if requests.is_empty() {
            return;
        }
        let n = requests.len() as u64;
        let batch: Vec<_> = {
            let mut outstanding = self
                .outstanding
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            (requests.drain(..))
                .filter(|request| outstanding.insert(sent(request)))
                .map(|request| Outgoing { holder, request })
                .collect()
        };
        self.requests += n;
        self.shared
            .repeats_held
            .fetch_add(n - batch.len() as u64, Ordering::Relaxed);
        if batch.is_empty() {
            return;
        }
        let Some(to_thread) = &self.to_thread else {
            self.dropped += n;
            return;
        };
        if let Err(TrySendError::Full(batch) | TrySendError::Disconnected(batch)) =
            to_thread.try_send(batch)
        {
            self.dropped += batch.len() as u64;
            forget(&self.outstanding, &batch);
        }
    }

    fn receive(&mut self, out: &mut Vec<Reply<K, Value>>) {
        let before = out.len();
        out.extend(self.answers.try_iter());
        // The wake socket is drained only when answers came (a receive with none makes no
        // system call); an answer that comes meanwhile wakes it again, so none is missed.
        if out.len() > before {
            let mut drain = [0u8; 256];
            while matches!(self.wake.read(&mut drain), Ok(n) if n > 0) {}
            out.extend(self.answers.try_iter());
        }
    }

    fn wake_fd(&self) -> Option<RawFd> {
        Some(self.wake.as_raw_fd())
    }

    fn counters(&self) -> LinkCounters {
        let s = &self.shared;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LinkCounters {
            requests: self.requests,
            answers: get(&s.answers),
            round_trips: get(&s.round_trips),
            dropped: self.dropped + get(&s.dropped),
            errors: get(&s.errors),
            reconnects: get(&s.reconnects),
            short_of_replicas: get(&s.short_of_replicas),
            connected: get(&s.connected),
            repeats_held: get(&s.repeats_held),
        }
    }
}

impl<K> Drop for RedisLink<K> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.to_thread = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Takes answered (or lost) requests out of the outstanding ones.
fn forget<K: StoreKey>(outstanding: &Outstanding<K>, round: &[Outgoing<K>]) {
    let mut outstanding = outstanding.lock().unwrap_or_else(PoisonError::into_inner);
    for o in round {
        outstanding.remove(&sent(&o.request));
    }
}

struct LinkThread<K> {
    config: Arc<RedisConfig>,
    conn: Option<Conn>,
    shared: Arc<Shared>,
    outstanding: Outstanding<K>,
    answer: Sender<Reply<K, Value>>,
    wake: UnixStream,
    /// Why the store is out of reach, as last logged (none: it is not): each reason is
    /// logged once an outage, so that one found while connecting again (the functions of
    /// a newer version there) is not hidden behind the first.
    outage_logged: Option<String>,
    /// A cluster's nodes as last seen ([`connect`]).
    nodes: Vec<String>,
}

impl<K: StoreKey> LinkThread<K> {
    fn run(&mut self, batches: &Receiver<Vec<Outgoing<K>>>, stop: &AtomicBool) {
        let mut backoff = Duration::from_millis(10);
        loop {
            let mut round = match batches.recv_timeout(Duration::from_millis(100)) {
                Ok(batch) => batch,
                Err(crossbeam_channel::RecvTimeoutError::Timeout)
                    if !stop.load(Ordering::Relaxed) =>
                {
                    continue;
                }
                Err(_) => return,
            };
            while round.len() < PIPELINE {
                match batches.try_recv() {
                    Ok(mut batch) => round.append(&mut batch),
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            }
            if self.conn.is_none() {
                match connect(&self.config, &mut self.nodes, self.outage_logged.is_some()) {
                    Ok(conn) => {
                        if self.outage_logged.is_some() {
                            log::warn!(
                                "Redis store {}: connected again",
                                redis_client::redacted(&self.config.url)
                            );
                            self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
                        }
                        self.conn = Some(conn);
                        self.outage_logged = None;
                        self.shared.connected.store(1, Ordering::Relaxed);
                        backoff = Duration::from_millis(10);
                    }
                    Err(e) => {
                        self.lost(&e, round.len());
                        forget(&self.outstanding, &round);
                        std::thread::sleep(backoff);
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                        continue;
                    }
                }
            }
            self.round_trip(&round);
            forget(&self.outstanding, &round);
        }
    }

    /// The server is out of reach: the round's requests go unanswered (the replicas send
    /// them again), and each reason for the outage is logged once.
    fn lost(&mut self, why: &str, requests: usize) {
        self.conn = None;
        self.shared.connected.store(0, Ordering::Relaxed);
        self.shared.errors.fetch_add(1, Ordering::Relaxed);
        self.shared
            .dropped
            .fetch_add(requests as u64, Ordering::Relaxed);
        if self.outage_logged.as_deref() != Some(why) {
            log::warn!(
                "Redis store {}: {why}; replicated flows wait (their packets held, then dropped) \
                 until it is back",
                redis_client::redacted(&self.config.url)
            );
            self.outage_logged = Some(why.to_string());
        }
    }

    fn round_trip(&mut self, round: &[Outgoing<K>]) {
        let config = Arc::clone(&self.config);
        let writes = (round.iter()).any(|o| matches!(o.request, Request::Write { .. }));
        // Each call carries a run of one holder's requests, up to `batch` of them.
        let batch = if config.cluster {
            1
        } else {
            config.batch.max(1)
        };
        let mut spans: Vec<std::ops::Range<usize>> = Vec::new();
        for (i, o) in round.iter().enumerate() {
            match spans.last_mut() {
                Some(span) if span.len() < batch && round[span.start].holder == o.holder => {
                    span.end = i + 1;
                }
                _ => spans.push(i..i + 1),
            }
        }
        let calls: Vec<redis::Cmd> = (spans.iter())
            .map(|span| call(&config, &round[span.clone()], batch > 1))
            .collect();
        let wait = config.wait.filter(|_| writes).map(|(replicas, timeout)| {
            let mut wait = redis::cmd("WAIT");
            wait.arg(replicas).arg(timeout.as_millis() as u64);
            wait
        });
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let answered: redis::RedisResult<Vec<redis::Value>> = match conn {
            Conn::One(c) => {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for cmd in calls.into_iter().chain(wait) {
                    pipe.add_command(cmd);
                }
                pipe.query(c)
            }
            Conn::Cluster(c) => {
                // A cluster pipeline cannot leave an error in its place: one fails the
                // round, whose requests then go unanswered and are sent again.
                let mut pipe = redis::cluster::cluster_pipe();
                for cmd in calls {
                    pipe.add_command(cmd);
                }
                // WAIT names no key: it goes after the pipeline to every master, on the
                // connection the pipeline took to each, and answers the fewest replicas
                // any master has the round's writes on (redis-rs's routing of WAIT).
                pipe.query(c).and_then(|mut values: Vec<redis::Value>| {
                    if let Some(wait) = wait {
                        values.push(wait.query(c)?);
                    }
                    Ok(values)
                })
            }
        };
        let values: Vec<redis::Value> = match answered {
            Ok(values) => values,
            Err(e) => {
                self.lost(&e.to_string(), round.len());
                return;
            }
        };
        self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
        let replicated = match config.wait {
            Some((replicas, _)) if writes => {
                matches!(values.last(), Some(redis::Value::Int(n)) if *n >= i64::from(replicas))
            }
            _ => true,
        };
        // Each request with its answer: a batch's answer is an array of its calls'.
        let mut answers = Vec::with_capacity(round.len());
        for (span, value) in spans.iter().zip(&values) {
            match value {
                redis::Value::Array(items) if batch > 1 && items.len() == span.len() => {
                    answers.extend(items.iter());
                }
                _ if batch > 1 => {
                    self.lost(&format!("a batch answered {value:?}"), span.len());
                    return;
                }
                _ => answers.push(value),
            }
        }
        let mut answered = 0;
        for (o, value) in round.iter().zip(answers) {
            match parse(o.request.key(), value) {
                Ok(Reply::Written { .. }) if !replicated => {
                    self.shared
                        .short_of_replicas
                        .fetch_add(1, Ordering::Relaxed);
                }
                Ok(reply) => {
                    answered += 1;
                    if self.answer.send(reply).is_err() {
                        return; // the link is gone
                    }
                }
                Err(e) => {
                    // A server restarted without its functions answers so: load them again.
                    self.lost(&e, 1);
                }
            }
        }
        self.shared.answers.fetch_add(answered, Ordering::Relaxed);
        let _ = self.wake.write(&[1]);
    }
}

/// A flow's record's name: `PREFIX:{TAG}REST`, the key's bytes in hex, the braces
/// around its hash tag (the whole key, unless it is tagged).
fn record_name<K: StoreKey>(prefix: &str, key: &K) -> String {
    named(prefix, ":", key)
}

/// An alias's record's name: `PREFIX:alias:{TAG}REST`, in the slot of its flow's.
fn alias_name<K: StoreKey>(prefix: &str, alias: &K) -> String {
    named(prefix, ":alias:", alias)
}

fn named<K: StoreKey>(prefix: &str, kind: &str, key: &K) -> String {
    use std::fmt::Write as _;
    let mut bytes = Vec::new();
    key.key_bytes(&mut bytes);
    let tag = key.tag_len().min(bytes.len());
    let mut name = String::with_capacity(prefix.len() + kind.len() + 2 + 2 * bytes.len());
    name.push_str(prefix);
    name.push_str(kind);
    name.push('{');
    for (i, b) in bytes.iter().enumerate() {
        if i == tag {
            name.push('}');
        }
        let _ = write!(name, "{b:02x}");
    }
    if tag == bytes.len() {
        name.push('}');
    }
    name
}

fn micros(ns: u64) -> u64 {
    ns.div_ceil(1_000)
}

/// A state's life as the functions take it: microseconds, held to what a Lua number holds
/// exactly (2^53 us: 285 years), and -1 for a state that never times out.
fn keep_micros(keep_ns: u64) -> i64 {
    if keep_ns == KEEP_FOREVER {
        return -1;
    }
    micros(keep_ns).min(1 << 53) as i64
}

/// The function call for `requests` (of one holder): with `batch`, one call of
/// `stateplane_v2_batch` for all of them; without, the single function of the one request.
fn call<K: StoreKey>(config: &RedisConfig, requests: &[Outgoing<K>], batch: bool) -> redis::Cmd {
    let Some(first) = requests.first() else {
        return redis::cmd("PING");
    };
    let holder = format!("{}:{}", first.holder.switch, first.holder.incarnation);
    let (min, max) = (
        config.min_lease.as_micros() as u64,
        config.max_lease.as_micros() as u64,
    );
    let retain = config.retain.as_millis() as u64;
    let mut names = Vec::new();
    let mut cmd = redis::cmd("FCALL");
    if batch {
        for o in requests {
            keys(&config.prefix, &o.request, &mut names);
        }
        cmd.arg(function("batch")).arg(names.len()).arg(&names);
        cmd.arg(holder).arg(min).arg(max).arg(retain);
        for o in requests {
            let kind = match o.request {
                Request::Acquire { .. } => "A",
                Request::Write { .. } => "W",
                Request::Renew { .. } => "R",
                Request::Resolve { .. } => "S",
            };
            cmd.arg(kind);
            own_args(&mut cmd, &o.request);
        }
    } else {
        let step = match first.request {
            Request::Acquire { .. } => "acquire",
            Request::Write { .. } => "write",
            Request::Renew { .. } => "renew",
            Request::Resolve { .. } => "resolve",
        };
        keys(&config.prefix, &first.request, &mut names);
        cmd.arg(function(step)).arg(names.len()).arg(&names);
        if !matches!(first.request, Request::Resolve { .. }) {
            cmd.arg(holder);
        }
        own_args(&mut cmd, &first.request);
        if !matches!(first.request, Request::Resolve { .. }) {
            cmd.arg(min).arg(max).arg(retain);
        }
    }
    cmd
}

/// The records a request's call names (its `KEYS`): the flow's, and its alias's when the
/// request names one; an alias's alone for a resolve.
fn keys<K: StoreKey>(prefix: &str, request: &Request<K, Value>, out: &mut Vec<String>) {
    match request {
        Request::Resolve { alias, .. } => out.push(alias_name(prefix, alias)),
        Request::Write { key, alias, .. } | Request::Renew { key, alias, .. } => {
            out.push(record_name(prefix, key));
            if let Some(alias) = alias {
                out.push(alias_name(prefix, alias));
            }
        }
        Request::Acquire { key, .. } => out.push(record_name(prefix, key)),
    }
}

/// A request's own arguments, in the order both the single functions and the batch take
/// them.
fn own_args<K: StoreKey>(cmd: &mut redis::Cmd, request: &Request<K, Value>) {
    match request {
        Request::Acquire {
            lease_ns, nonce, ..
        } => {
            cmd.arg(micros(*lease_ns)).arg(*nonce);
        }
        Request::Write {
            epoch,
            seq,
            value,
            lease_ns,
            keep_ns,
            key,
            alias,
        } => {
            cmd.arg(*epoch).arg(seq.to_string()).arg(value.as_slice());
            cmd.arg(micros(*lease_ns)).arg(keep_micros(*keep_ns));
            // The flow's key, kept by the alias's record (none: no alias).
            let mut flow = Vec::new();
            if alias.is_some() {
                key.encode(&mut flow);
            }
            cmd.arg(flow);
        }
        Request::Renew {
            epoch,
            lease_ns,
            nonce,
            keep_ns,
            alias,
            ..
        } => {
            cmd.arg(*epoch).arg(micros(*lease_ns)).arg(*nonce);
            cmd.arg(keep_micros(*keep_ns))
                .arg(u8::from(alias.is_some()));
        }
        Request::Resolve { nonce, .. } => {
            cmd.arg(*nonce);
        }
    }
}

/// A store's answer to one of the replication functions, from its bytes as they come over
/// the wire (RESP): what a store that misbehaves, or something posing as one, can send.
/// Every element is checked; nothing in it is trusted (the fuzz target `store_reply`).
pub fn reply_from_wire(key: u32, bytes: &[u8]) -> Result<Reply<u32, Value>, String> {
    let value = redis::parse_redis_value(bytes).map_err(|e| e.to_string())?;
    parse(key, &value)
}

/// A function's answer, read with every element checked.
fn parse<K: StoreKey>(key: K, value: &redis::Value) -> Result<Reply<K, Value>, String> {
    let items = match value {
        redis::Value::Array(items) => items.as_slice(),
        redis::Value::ServerError(e) if e.details().is_some_and(|d| d.contains("not found")) => {
            return Err(format!(
                "the store has no function {} (a server restarted without its functions, \
                 or a switch of another stateplane version loaded its own over them): \
                 loading this switch's again",
                function("*")
            ));
        }
        redis::Value::ServerError(e) => return Err(format!("the store refused a call: {e:?}")),
        other => {
            return Err(format!(
                "an answer not of the replication functions: {other:?}"
            ));
        }
    };
    let bytes = |i: usize| -> Result<&[u8], String> {
        match items.get(i) {
            Some(redis::Value::BulkString(b)) => Ok(b),
            Some(redis::Value::SimpleString(s)) => Ok(s.as_bytes()),
            other => Err(format!("element {i} of an answer is {other:?}")),
        }
    };
    let number = |i: usize| -> Result<u64, String> {
        match items.get(i) {
            Some(redis::Value::Int(n)) => u64::try_from(*n).map_err(|e| e.to_string()),
            _ => std::str::from_utf8(bytes(i)?)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("element {i} of an answer is not a number")),
        }
    };
    let ns = |i: usize| number(i).map(|us| us.saturating_mul(1_000));
    Ok(match bytes(0)? {
        b"G" => Reply::Granted {
            key,
            epoch: number(1)?,
            seq: number(2)?,
            lease_ns: ns(3)?,
            nonce: number(4)?,
            value: (number(5)? == 1)
                .then(|| bytes(6).map(<[u8]>::to_vec))
                .transpose()?,
            // Element 7 came with the retaking of fenced writes: a grant without it is
            // from an older stateplane's functions, loaded over ours since we started.
            written_epoch: if items.len() == 7 {
                return Err(
                    "a lease granted without the epoch its record was last written \
                     under: the store runs an older stateplane's replication functions \
                     (FUNCTION LOAD by an older switch sharing it); stop the older \
                     switches, then start this one again so that it loads its own"
                        .to_string(),
                );
            } else {
                number(7)?
            },
        },
        b"H" => Reply::Held {
            key,
            remaining_ns: ns(1)?,
            nonce: number(2)?,
        },
        b"W" => Reply::Written {
            key,
            epoch: number(1)?,
            seq: number(2)?,
            lease_ns: ns(3)?,
        },
        b"R" => Reply::Renewed {
            key,
            epoch: number(1)?,
            lease_ns: ns(2)?,
            nonce: number(3)?,
        },
        b"F" => Reply::Fenced {
            key,
            epoch: number(1)?,
        },
        b"S" => Reply::Resolved {
            alias: key,
            nonce: number(1)?,
            flow: match number(2)? {
                1 => Some(
                    K::decode(bytes(3)?).ok_or("an alias's record does not hold a flow's key")?,
                ),
                _ => None,
            },
        },
        other => {
            return Err(format!(
                "an answer of unknown kind {:?}",
                String::from_utf8_lossy(other)
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clusters_nodes_are_each_named_once_and_those_with_no_address_by_none() {
        use redis::Value::{Array, BulkString, Int};
        let node = |host: &str, port| Array(vec![BulkString(host.into()), Int(port)]);
        let range = |start, nodes: Vec<redis::Value>| {
            Array([vec![Int(start), Int(start + 99)], nodes].concat())
        };
        let slots = Array(vec![
            range(0, vec![node("127.0.0.1", 7000), node("127.0.0.1", 7003)]),
            range(100, vec![node("127.0.0.1", 7000), node("?", 7004)]),
            range(
                200,
                vec![node("", 7005), node("::1", 7001), node("h", 70_000)],
            ),
            Int(3),
        ]);
        assert_eq!(
            cluster_nodes("redis://:pw@127.0.0.1:7000/", &slots),
            [
                "redis://:pw@127.0.0.1:7000/",
                "redis://:pw@127.0.0.1:7003/",
                "redis://:pw@[::1]:7001/"
            ]
        );
        assert!(cluster_nodes("redis://h:1/", &Int(0)).is_empty());
    }

    #[test]
    fn records_are_named_with_the_key_as_hash_tag() {
        use stateplane_replication::FlowBytes;
        let key = FlowBytes::new(&[0, 0xab, 7]).unwrap();
        assert_eq!(record_name("p", &key), "p:{00ab07}");
        // A flow and its alias share their tag: one slot.
        let flow = FlowBytes::tagged(&[1, 2, 3, 4], 2).unwrap();
        let alias = FlowBytes::tagged(&[1, 2, 9], 2).unwrap();
        assert_eq!(record_name("p", &flow), "p:{0102}0304");
        assert_eq!(alias_name("p", &alias), "p:alias:{0102}09");
        assert_eq!(record_name("p", &0x0102u16), "p:{0102}");
        let mut kept = Vec::new();
        StoreKey::encode(&flow, &mut kept);
        assert_eq!(<FlowBytes as StoreKey>::decode(&kept), Some(flow));
        assert_eq!(
            <FlowBytes as StoreKey>::decode(&[5, 1, 2]),
            None,
            "a tag past the key"
        );
    }

    #[test]
    fn answers_of_another_shape_are_refused_not_trusted() {
        let s = |v: &str| redis::Value::BulkString(v.as_bytes().to_vec());
        let fields = vec![
            s("G"),
            s("3"),
            s("18446744073709551615"),
            s("100000"),
            s("9"),
            redis::Value::Int(1),
            s("xy"),
            s("2"),
        ];
        let granted = redis::Value::Array(fields.clone());
        assert_eq!(
            parse(7u32, &granted),
            Ok(Reply::Granted {
                key: 7,
                epoch: 3,
                seq: u64::MAX,
                lease_ns: 100_000_000,
                nonce: 9,
                value: Some(b"xy".to_vec()),
                written_epoch: 2,
            })
        );
        // The same answer as its bytes on the wire.
        let wire = b"*8\r\n$1\r\nG\r\n$1\r\n3\r\n$20\r\n18446744073709551615\r\n$6\r\n100000\r\n$1\r\n9\r\n:1\r\n$2\r\nxy\r\n$1\r\n2\r\n";
        assert_eq!(reply_from_wire(7, wire), parse(7u32, &granted));
        assert!(
            reply_from_wire(7, b"*7\r\n$1\r\nG\r\n").is_err(),
            "cut short"
        );
        // A grant as an older stateplane's functions give it: no `written_epoch`.
        let older = redis::Value::Array(fields[..7].to_vec());
        let refused = parse(7u32, &older).unwrap_err();
        assert!(
            refused.contains("older stateplane's replication functions")
                && refused.contains("stop the older switches"),
            "{refused}"
        );
        // Its functions gone: a server restarted empty, or another version's loaded.
        let missing = reply_from_wire(7, b"-ERR Function not found\r\n").unwrap_err();
        assert!(
            missing.contains("no function stateplane_v2_*")
                && missing.contains("another stateplane version"),
            "{missing}"
        );
        for bad in [
            redis::Value::Array(vec![s("G"), s("3")]),
            redis::Value::Array(vec![s("Z")]),
            redis::Value::Array(vec![s("W"), s("-1"), s("1"), s("1")]),
            redis::Value::Int(1),
            redis::Value::Nil,
        ] {
            assert!(parse(7u32, &bad).is_err(), "{bad:?}");
        }
    }
}
