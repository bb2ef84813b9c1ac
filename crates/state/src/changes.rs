//! The changes synced state makes on a worker's thread, for the worker's sync stage: a
//! tracked register (and the count-min sketch built on one) records each change of a cell
//! as `(state, index, old, new)` here, and the stage takes them once a burst. State that is
//! not tracked never comes here: its path has one predictable branch more.
//!
//! Must never: grow without bound. Past `CAPACITY` changes not taken, the others are
//! counted as dropped, and the anti-entropy refresh makes the collector's copy whole again.

use std::cell::RefCell;

/// One change of one cell of synced state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// The state's id among the worker's synced state.
    pub state: u16,
    pub index: u32,
    pub old: u64,
    pub new: u64,
}

/// Changes held between two takes at most (a burst's worth many times over).
pub const CAPACITY: usize = 1 << 20;

#[derive(Default)]
struct Log {
    changes: Vec<Change>,
    dropped: u64,
}

thread_local! {
    static LOG: RefCell<Log> = RefCell::new(Log::default());
}

/// Records a change made on this thread.
#[inline]
pub fn record(change: Change) {
    LOG.with_borrow_mut(|log| {
        if log.changes.len() < CAPACITY {
            log.changes.push(change);
        } else {
            log.dropped += 1;
        }
    });
}

/// Moves the changes recorded on this thread since the last take into `out`; how many
/// were dropped for want of room.
pub fn take(out: &mut Vec<Change>) -> u64 {
    LOG.with_borrow_mut(|log| {
        out.append(&mut log.changes);
        std::mem::take(&mut log.dropped)
    })
}
