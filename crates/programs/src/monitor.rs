//! `monitor`: observes only. Every packet ends here, dropped as `observed`, so that a
//! passive monitor's taps (flow records) see it and nothing goes out; its records carry no
//! egress port. What `stateplane flows` runs behind its flow stage. Not in the catalog: a
//! configuration that wants a monitor runs `stateplane flows` or a program with a `[flows]`
//! section and `io = "observe"`.

use stateplane_runtime::{Burst, Context, DropReason, Program, Verdict};

/// The drop reason of every packet a monitor sees.
const OBSERVED: DropReason = DropReason::program(0);

pub struct Monitor;

impl Program for Monitor {
    type Prepared = ();

    fn process(&mut self, burst: &mut Burst, _ctx: &mut Context) {
        for d in burst.descs_mut() {
            d.verdict = Verdict::Drop(OBSERVED);
        }
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &["observed"]
    }
}
