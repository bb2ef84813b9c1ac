//! State stages: the duties that keep a guarantee of the program's declared state (the
//! sync stage of `synced` state now; replication's later). The worker runs each between
//! two bursts with the program in hand, so a stage may read the program's synced state
//! and commit a write to it whole, where no packet is in flight.
//!
//! Must never: block, or change state a packet could see half changed (a stage commits a
//! write whole, between bursts, or not at all).

use crate::program::{Context, Running};

pub trait StateStage: Send {
    /// After each burst, once the program and the taps have seen it (a stage keeps its own
    /// pace: it need not do its work after every one).
    fn after_burst(&mut self, program: &mut dyn Running, ctx: &Context);

    /// With no packets, on the loop's clock (about once a millisecond on live ports), so
    /// that timers run while traffic is idle.
    fn tick(&mut self, program: &mut dyn Running, ctx: &Context);

    /// A reload swapped in `program`, a new instance whose state starts afresh.
    fn reloaded(&mut self, program: &mut dyn Running, ctx: &Context);

    /// The worker is stopping: hand on everything held.
    fn finish(&mut self, program: &mut dyn Running, ctx: &Context);

    /// A descriptor that becomes readable when work comes from outside (the stage's
    /// socket): an idle worker waits on it with its ports, and ticks when woken.
    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// Makes one state stage per worker (`worker index -> stage`).
pub type StateStageFactory = std::sync::Arc<dyn Fn(usize) -> Box<dyn StateStage> + Send + Sync>;
