//! The `synced` guarantee's protocol cores (ApproSync, and beyond it), with no I/O: each is
//! a state machine fed `(now, input)` that returns what to send, so that it runs the same
//! under a real clock and a virtual one.
//!
//! - [`wire`]: the sync messages (docs/SYNC.md), built and read with every length checked;
//! - [`read_handler`]: a worker's changes to synced state, turned into updates when a
//!   location's divergence from what the collector holds reaches the threshold `t`
//!   (the paper's Algorithm 1);
//! - [`rate`]: the rate controller, which sets `t` each window from the total change;
//! - [`sender`]: updates into numbered messages, each carrying the largest `t` in force since
//!   the one before, with heartbeats and the anti-entropy refresh of every location;
//! - [`mirror`]: the collector's copy of each switch's state, with the bound that holds for
//!   each location, or none after a lost message until the location is sent again;
//! - [`write`](mod@write): top-down writes, split into parts, sent again until acknowledged, and
//!   committed whole between two bursts;
//! - [`collector`](mod@collector): the collector whole: datagrams in and out, reads, writes,
//!   the streams' freshness and the changes as applied, for a shell of sockets;
//! - [`channel`]: a channel on the virtual clock that drops past its capacity and loses,
//!   duplicates and reorders at configured rates, for the simulation and the experiments.
//!
//! Must never: read a clock or do I/O (time arrives as `now_ns`), or let the mirror claim a
//! bound that does not hold.

pub mod channel;
pub mod collector;
pub mod mirror;
pub mod rate;
pub mod read_handler;
pub mod sender;
pub mod wire;
pub mod write;

/// A location of synced state: which state (its id in the switch's declarations) and which
/// index in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    pub state: u16,
    pub index: u32,
}

impl Location {
    /// The location as one word (state in the high bits), for hashing and compact tables.
    #[inline]
    pub fn packed(self) -> u64 {
        (u64::from(self.state) << 32) | u64::from(self.index)
    }

    #[inline]
    pub fn unpacked(word: u64) -> Location {
        Location {
            state: (word >> 32) as u16,
            index: word as u32,
        }
    }
}

/// A location's value as sent, with the threshold in force when it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Update {
    pub location: Location,
    pub value: u64,
    pub threshold: u64,
}

/// How far a value may be from the data plane's when every change of `threshold` or more is
/// sent: a divergence below the threshold (none at all with a threshold of 0 or 1).
#[inline]
pub fn divergence_bound(threshold: u64) -> u64 {
    threshold.saturating_sub(1)
}
