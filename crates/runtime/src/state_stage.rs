//! State stages: the duties that keep a guarantee of the program's declared state (the
//! sync stage of `synced` state, the replication stage of `replicated` state). The worker
//! runs each between two bursts with the program in hand, so a stage may read the
//! program's synced state and commit a write to it whole, where no packet is in flight.
//! A stage may also act on a burst around the program (replication: a packet waits for its
//! flow's lease before it is processed, its output for the store's acknowledgement after),
//! through [`StateStage::before_program`] and [`StateStage::after_program`].
//!
//! A stage that must hold a packet (its flow's lease is not here yet, its output waits for
//! the store) takes it out of the burst and puts it back into a later one, with
//! [`crate::Held`]: the worker never waits for it.
//!
//! Must never: block, or change state a packet could see half changed (a stage commits a
//! write whole, between bursts, or not at all); take a packet out of a burst without
//! counting it.

use crate::burst::Burst;
use crate::program::{Context, Running};

pub trait StateStage: Send {
    /// After each burst, once the program and the taps have seen it (a stage keeps its own
    /// pace: it need not do its work after every one).
    fn after_burst(&mut self, program: &mut dyn Running, ctx: &Context);

    /// With no packets, on the loop's clock (about once a millisecond on live ports), so
    /// that timers run while traffic is idle.
    fn tick(&mut self, program: &mut dyn Running, ctx: &Context);

    /// A reload swapped in `program`, a new instance whose state starts afresh, for `old`,
    /// the instance replaced, still whole (a stage may carry its state over).
    fn reloaded(&mut self, old: &mut dyn Running, program: &mut dyn Running, ctx: &Context);

    /// The worker is stopping: hand on everything held.
    fn finish(&mut self, program: &mut dyn Running, ctx: &Context);

    /// A descriptor that becomes readable when work comes from outside (the stage's
    /// socket): an idle worker waits on it with its ports, and ticks when woken.
    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// A parsed burst before the program sees it: the stage may take packets out (they
    /// are not processed; the stage counts them).
    fn before_program(&mut self, _burst: &mut Burst, _program: &mut dyn Running, _ctx: &Context) {}

    /// The burst after the program, before its verdicts are counted and the taps see it:
    /// the stage may change verdicts (an output that must not leave is dropped, with its
    /// reason).
    fn after_program(&mut self, _burst: &mut Burst, _program: &mut dyn Running, _ctx: &Context) {}

    /// Packets the stage holds across bursts (taken out of one, to go back into a later
    /// one: see [`crate::Held`]). Each must go out, or be dropped and counted, in bounded
    /// time: a finishing worker hands the stage empty bursts until it holds none.
    fn holding(&self) -> usize {
        0
    }

    /// Whether held packets are ready to go back now (to be processed, or to leave): the
    /// worker then hands the stage a burst of their own rather than wait for the next.
    fn releasable(&self) -> bool {
        false
    }

    /// Whether the stage holds so many packets waiting on something outside (a store's
    /// answers) that more would overflow it: a run on packet time (a capture, which can
    /// wait) ticks the stage until it is not, before the next burst, rather than have it
    /// drop what comes faster than the store answers. Live ports cannot wait: packets
    /// keep coming, and past the stage's bound they are dropped and counted.
    fn backlogged(&self) -> bool {
        false
    }
}

/// Makes one state stage per worker (`worker index -> stage`).
pub type StateStageFactory = std::sync::Arc<dyn Fn(usize) -> Box<dyn StateStage> + Send + Sync>;
