//! The collector's copy written through to Redis (`stateplane collector --redis URL`), for
//! applications that read it there. A thread takes the changes the collector core applies
//! (`Collector::changes_after`) every few milliseconds and writes them in one pipeline:
//!
//! - `stateplane:sync:SWITCH:STREAM:STATE`, a hash of index to value;
//! - `stateplane:sync:SWITCH:STREAM`, a hash of the stream's `epoch`, `last_seq`,
//!   `as_of_ns` (the switch's clock), `missing` and `threshold`.
//!
//! Redis holds values and freshness; a value's bound is the collector's to give (its API).
//! When a switch starts again (a new epoch), its stream's hashes are deleted before the
//! new values land, so that no value of the old run is read as the new one's.
//!
//! Must never: stop the collector when Redis goes away. A failed write is counted and
//! logged, the connection made again, and then the whole copy written again (the store
//! may have lost anything), as it is when the thread falls too far behind.

use stateplane_control::collector_api::CollectorHandle;
use stateplane_stores::redis_client::{self, Connector, RedisTls};
use stateplane_sync::collector::Applied;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often the thread looks for changes.
const EVERY: Duration = Duration::from_millis(5);
/// Changes written per pipeline at most.
const BATCH: usize = 65_536;
/// How long a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// What the Redis writer did.
#[derive(Debug, Default)]
pub struct RedisCounters {
    pub values: AtomicU64,
    pub errors: AtomicU64,
    /// Whole copies written (after a connection, or after falling behind).
    pub resyncs: AtomicU64,
}

/// The key of a stream's hash, and of one of its states' hash.
fn stream_key(switch: u32, stream: u16) -> String {
    format!("stateplane:sync:{switch}:{stream}")
}

fn state_key(switch: u32, stream: u16, state: u16) -> String {
    format!("stateplane:sync:{switch}:{stream}:{state}")
}

/// The set of the states a stream has hashes for, so that clearing them never scans the
/// keyspace (`KEYS` blocks a shared server for as long as it has keys).
fn states_key(switch: u32, stream: u16) -> String {
    format!("stateplane:sync:{switch}:{stream}:states")
}

/// Deletes the hashes of every state in the set `KEYS[1]` (`ARGV[1]` is the stream's key,
/// the states' prefix), and the set.
const CLEAR_STATES: &str = "for _, state in ipairs(redis.call('SMEMBERS', KEYS[1])) do \
     redis.call('DEL', ARGV[1] .. ':' .. state) end \
     redis.call('DEL', KEYS[1])";

/// Connects to `url` once (with `tls`'s certificates; through Sentinel, to the master it
/// names), so that a wrong URL, a refused password or certificate, a server not running,
/// a node of a Redis Cluster, or a server that evicts keys
/// ([`redis_client::check_keeps_keys`]) is refused before the collector starts.
pub fn check(url: &str, tls: Option<RedisTls>) -> Result<Connector, String> {
    let with_flag = |e: String| format!("--redis {e}");
    let connector = Connector::new(url, tls, "--redis-ca").map_err(with_flag)?;
    let mut conn = connector.connect(CONNECT_TIMEOUT).map_err(with_flag)?;
    redis::cmd("PING")
        .query::<String>(&mut conn)
        .map_err(|e| with_flag(redis_client::explain(url, &e, "--redis-ca")))?;
    redis_client::check_not_cluster(
        &mut conn,
        url,
        "the copy is not written to a cluster (not built yet): name one server, or the \
         sentinels of one (redis+sentinel://)",
    )
    .map_err(with_flag)?;
    redis_client::check_keeps_keys(&mut conn, url, "the copy's values").map_err(with_flag)?;
    Ok(connector)
}

/// The writer's thread; it writes what is left and stops when `stop` is raised.
pub struct RedisWriter {
    pub counters: Arc<RedisCounters>,
    thread: Option<std::thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl RedisWriter {
    pub fn start(connector: Connector, handle: Arc<CollectorHandle>) -> RedisWriter {
        let counters = Arc::new(RedisCounters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut state = Writer {
            connector,
            conn: None,
            cursor: 0,
            epochs: HashMap::new(),
            counters: counters.clone(),
            failing: false,
        };
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("redis-mirror".into())
            .spawn(move || {
                loop {
                    let last = stopping.load(Ordering::Relaxed);
                    state.pass(&handle);
                    if last {
                        return;
                    }
                    std::thread::sleep(EVERY);
                }
            })
            .ok();
        RedisWriter {
            counters,
            thread,
            stop,
        }
    }

    /// Writes what is left, then stops.
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Writer {
    connector: Connector,
    conn: Option<redis::Connection>,
    /// The number of the last change written.
    cursor: u64,
    /// Each stream's epoch as written, and the states written of it.
    epochs: HashMap<(u32, u16), (u32, BTreeSet<u16>)>,
    counters: Arc<RedisCounters>,
    failing: bool,
}

impl Writer {
    fn pass(&mut self, handle: &CollectorHandle) {
        if let Err(e) = self.write(handle) {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            if !self.failing {
                log::warn!(
                    "redis: {e}; the collector goes on, and writes its whole copy again once Redis is back"
                );
            }
            self.failing = true;
            self.conn = None;
        }
    }

    fn write(&mut self, handle: &CollectorHandle) -> Result<(), String> {
        let resync = self.conn.is_none();
        if resync {
            self.conn = Some(self.connector.connect(CONNECT_TIMEOUT)?);
            if self.failing {
                log::info!("redis: connected again; writing the whole copy");
            }
        }
        let mut pipe = redis::pipe();
        let (streams, changes, whole) = handle.with(|c| {
            let (changes, missed) = c.changes_after(self.cursor, BATCH);
            let streams = c.streams();
            // A new connection, or changes no longer kept: the whole copy, as of now.
            let whole = (resync || missed > 0).then(|| {
                (streams.iter())
                    .map(|s| (s.switch, s.stream, s.epoch, c.held(s.switch, s.stream)))
                    .collect::<Vec<_>>()
            });
            (streams, changes, whole)
        });
        let mut values = 0u64;
        if let Some(whole) = whole {
            for (switch, stream, epoch, held) in whole {
                self.restarted(&mut pipe, switch, stream, epoch, true);
                for (l, r) in held {
                    self.note_state(&mut pipe, switch, stream, l.state);
                    pipe.hset(state_key(switch, stream, l.state), l.index, r.value)
                        .ignore();
                    values += 1;
                }
            }
            // Everything applied so far is in the copy just written.
            self.cursor = handle.with(|c| c.next_change()) - 1;
            self.counters.resyncs.fetch_add(1, Ordering::Relaxed);
        } else {
            for a in &changes {
                self.change(&mut pipe, a);
                values += 1;
            }
            if let Some(last) = changes.last() {
                self.cursor = last.number;
            }
        }
        for s in &streams {
            self.restarted(&mut pipe, s.switch, s.stream, s.epoch, false);
            pipe.hset_multiple(
                stream_key(s.switch, s.stream),
                &[
                    ("epoch", u64::from(s.epoch)),
                    ("last_seq", s.last_seq),
                    ("as_of_ns", s.as_of_ns),
                    ("missing", s.missing),
                    ("threshold", s.threshold),
                ],
            )
            .ignore();
        }
        // Redis refuses an empty pipeline.
        if let Some(conn) = &mut self.conn
            && pipe.cmd_iter().next().is_some()
        {
            pipe.query::<()>(conn).map_err(|e| e.to_string())?;
        }
        self.counters.values.fetch_add(values, Ordering::Relaxed);
        if self.failing {
            self.failing = false;
        }
        Ok(())
    }

    /// Notes that the stream has a hash for `state` (in the stream's set too, the first
    /// time).
    fn note_state(&mut self, pipe: &mut redis::Pipeline, switch: u32, stream: u16, state: u16) {
        if let Some((_, states)) = self.epochs.get_mut(&(switch, stream))
            && states.insert(state)
        {
            pipe.sadd(states_key(switch, stream), state).ignore();
        }
    }

    fn change(&mut self, pipe: &mut redis::Pipeline, a: &Applied) {
        self.restarted(pipe, a.switch, a.stream, a.epoch, false);
        self.note_state(pipe, a.switch, a.stream, a.location.state);
        let key = state_key(a.switch, a.stream, a.location.state);
        pipe.hset(key, a.location.index, a.value).ignore();
    }

    /// Deletes a stream's hashes when its epoch is not the one written (or, with
    /// `always`, before a whole copy), so that no value of an old run stays.
    fn restarted(
        &mut self,
        pipe: &mut redis::Pipeline,
        switch: u32,
        stream: u16,
        epoch: u32,
        always: bool,
    ) {
        let known = self.epochs.get(&(switch, stream));
        if !always && known.is_some_and(|(e, _)| *e == epoch) {
            return;
        }
        // Every state the stream has a hash for, this collector's or an earlier one's.
        pipe.cmd("EVAL")
            .arg(CLEAR_STATES)
            .arg(1)
            .arg(states_key(switch, stream))
            .arg(stream_key(switch, stream))
            .ignore();
        self.epochs
            .insert((switch, stream), (epoch, BTreeSet::new()));
    }
}
