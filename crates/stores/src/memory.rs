//! The memory store: [`StoreCore`] in the switch's own process, shared by its workers
//! behind a lock, on the process's monotonic clock. A link answers at once: its answers
//! wait in the link until the worker takes them.
//!
//! Must never: outlive the process (it is the embedded default for one switch and for
//! tests; a switch that needs its flows to survive it names a Redis store).

use crate::{LinkCounters, StoreKey, StoreLink, Value};
use stateplane_replication::store::{StoreConfig, StoreCore};
use stateplane_replication::{Holder, Reply, Request};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The store; [`MemoryStore::link`] makes a worker's link to it.
pub struct MemoryStore<K> {
    core: Arc<Mutex<StoreCore<K, Value>>>,
    epoch: Instant,
}

impl<K: StoreKey> MemoryStore<K> {
    pub fn new(config: StoreConfig) -> Self {
        MemoryStore {
            core: Arc::new(Mutex::new(StoreCore::new(config))),
            epoch: Instant::now(),
        }
    }

    pub fn link(&self) -> MemoryLink<K> {
        MemoryLink {
            core: Arc::clone(&self.core),
            epoch: self.epoch,
            answers: Vec::new(),
            counters: LinkCounters {
                connected: 1,
                ..LinkCounters::default()
            },
        }
    }

    /// A flow's state and last write, as the store has them.
    pub fn read(&self, key: &K) -> Option<(u64, Option<Value>)> {
        let core = self.core.lock().ok()?;
        core.record(key).map(|r| (r.seq, r.value.clone()))
    }
}

pub struct MemoryLink<K> {
    core: Arc<Mutex<StoreCore<K, Value>>>,
    epoch: Instant,
    answers: Vec<Reply<K, Value>>,
    counters: LinkCounters,
}

impl<K: StoreKey> StoreLink<K> for MemoryLink<K> {
    fn send(&mut self, holder: Holder, requests: &mut Vec<Request<K, Value>>) {
        if requests.is_empty() {
            return;
        }
        let now_ns = self.epoch.elapsed().as_nanos() as u64;
        // A worker that panicked holding the lock leaves the store as it was after its
        // last whole request: each request is applied under the lock, whole.
        let mut core = match self.core.lock() {
            Ok(core) => core,
            Err(poisoned) => poisoned.into_inner(),
        };
        self.counters.requests += requests.len() as u64;
        self.counters.round_trips += 1;
        for request in requests.drain(..) {
            self.answers.push(core.handle(now_ns, holder, request));
        }
    }

    fn receive(&mut self, out: &mut Vec<Reply<K, Value>>) {
        self.counters.answers += self.answers.len() as u64;
        out.append(&mut self.answers);
    }

    fn wake_fd(&self) -> Option<RawFd> {
        None
    }

    fn counters(&self) -> LinkCounters {
        self.counters
    }
}
