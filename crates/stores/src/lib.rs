//! The stores behind the `replicated` guarantee, each reached through a [`StoreLink`]: a
//! worker sends its requests on it and takes the answers that came, and neither call ever
//! waits for the store.
//!
//! - [`memory`]: the store in the switch's own process (the embedded default, for one
//!   switch and for tests): [`stateplane_replication::store::StoreCore`] behind a lock, on
//!   the process's monotonic clock;
//! - [`redis`](mod@redis): a Redis 7 server, the lease, fencing epoch and sequenced write
//!   being functions loaded at connection (`functions.lua`), so that each is atomic and
//!   reads the server's clock; a thread per link pipelines the requests, and a server lost
//!   or restarted is reported and reconnected, never a crash.
//!
//! Must never: block a worker; answer a request that the store did not take (a request
//! lost with a connection is unanswered, and the replica sends it again).

pub mod memory;
pub mod redis;
pub mod redis_client;

use stateplane_replication::{Holder, Reply, Request};
use std::os::fd::RawFd;

/// A flow's state as the stores keep it: its bytes.
pub type Value = Vec<u8>;

/// A flow's key as a store names it.
pub trait StoreKey: Copy + Eq + std::hash::Hash + Ord + Send + 'static {
    /// Appends the key's bytes to `out`.
    fn key_bytes(&self, out: &mut Vec<u8>);

    /// How many of the key's leading bytes are its hash tag (a flow and its alias share
    /// it, and so a Redis Cluster slot).
    fn tag_len(&self) -> usize;

    /// Appends the key as a store keeps it as a value (the flow an alias names), which
    /// [`StoreKey::decode`] reads back.
    fn encode(&self, out: &mut Vec<u8>);

    fn decode(bytes: &[u8]) -> Option<Self>;
}

macro_rules! store_key_of_unsigned {
    ($($t:ty),*) => {$(
        impl StoreKey for $t {
            fn key_bytes(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_be_bytes());
            }

            fn tag_len(&self) -> usize {
                std::mem::size_of::<$t>()
            }

            fn encode(&self, out: &mut Vec<u8>) {
                self.key_bytes(out);
            }

            fn decode(bytes: &[u8]) -> Option<Self> {
                Some(<$t>::from_be_bytes(bytes.try_into().ok()?))
            }
        }
    )*};
}
store_key_of_unsigned!(u16, u32, u64, u128);

/// What a link did, for metrics and the run's summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkCounters {
    pub requests: u64,
    pub answers: u64,
    /// Round trips to the store (each carries many requests: pipelining).
    pub round_trips: u64,
    /// Requests dropped unsent: the link's queue was full, or the store unreachable.
    pub dropped: u64,
    /// Failed round trips (the connection lost, an error from the store).
    pub errors: u64,
    pub reconnects: u64,
    /// Writes answered but not on the configured number of replicas in time (`WAIT`): not
    /// passed on, so the replica sends them again.
    pub short_of_replicas: u64,
    /// Gauge: 1 while connected (the memory store always is).
    pub connected: u64,
    /// Requests sent again while the same was still queued or on the connection: not
    /// sent twice (a store that loses nothing answers the first).
    pub repeats_held: u64,
}

/// Where a worker's requests go and its answers come from.
pub trait StoreLink<K>: Send {
    /// Sends `holder`'s requests, taking them from `requests`; never waits.
    fn send(&mut self, holder: Holder, requests: &mut Vec<Request<K, Value>>);

    /// Appends the answers that came to `out`; never waits.
    fn receive(&mut self, out: &mut Vec<Reply<K, Value>>);

    /// A descriptor readable when answers wait (an idle worker waits on it).
    fn wake_fd(&self) -> Option<RawFd>;

    fn counters(&self) -> LinkCounters;
}

impl StoreKey for stateplane_replication::FlowBytes {
    fn key_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }

    fn tag_len(&self) -> usize {
        self.tag().len()
    }

    fn encode(&self, out: &mut Vec<u8>) {
        stateplane_replication::FlowBytes::encode(self, out);
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        stateplane_replication::FlowBytes::decode(bytes)
    }
}
