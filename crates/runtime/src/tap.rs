//! Taps: stages that see every packet a worker has handled, after the program, with its
//! final verdict (flow records now; mirrors later). A tap reads; it never changes a
//! packet or a verdict, and like a program it must not allocate or block per packet.

use crate::burst::Burst;
use crate::program::Context;

pub trait Tap: Send {
    /// Sees a burst after the program and the verdict counts.
    fn observe(&mut self, burst: &Burst, ctx: &Context);

    /// Called with no packets: on live ports about once a millisecond, so that timers run
    /// while traffic is idle.
    fn tick(&mut self, _ctx: &Context) {}

    /// The worker is stopping: hand on everything held.
    fn finish(&mut self, _ctx: &Context) {}
}

/// Makes one tap per worker (`worker index -> tap`).
pub type TapFactory = std::sync::Arc<dyn Fn(usize) -> Box<dyn Tap> + Send + Sync>;
