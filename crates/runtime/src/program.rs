//! The program interface: what a network function implements.
//!
//! A program sees a whole burst of parsed packets and sets each packet's [`Verdict`]. One
//! instance runs per worker, and each worker owns a shard of the flows (all packets of a
//! flow reach the same worker), so a program keeps its per-flow state in its own struct
//! with no locks. Malformed packets never reach a program: the runtime counts and drops
//! them first.

use crate::burst::Burst;
use stateplane_api::{ControlError, Declaration, Notification, Reply, Request};
use stateplane_wire::FlowHasher;

/// A port number: the index of the port in the switch's port list.
pub type PortId = u16;

/// Why a packet was dropped. Codes below [`DropReason::PROGRAM_BASE`] belong to the
/// runtime; a program's own reasons are `DropReason::program(i)`, named by the `i`-th entry
/// of its [`Program::drop_reasons`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DropReason(pub u8);

impl DropReason {
    /// The program set no verdict (a bug in the program, made visible in the counters).
    pub const NO_VERDICT: DropReason = DropReason(0);
    /// The packet failed to parse (counted by reason as well).
    pub const MALFORMED: DropReason = DropReason(1);
    /// The verdict named a port the switch does not have.
    pub const NO_SUCH_PORT: DropReason = DropReason(2);
    /// The frame was longer than `burst::MAX_FRAME`; refused at the port.
    pub const OVERSIZE: DropReason = DropReason(3);
    pub const PROGRAM_BASE: u8 = 16;
    /// How many codes there are in all (runtime and program).
    pub const COUNT: usize = 64;

    const RUNTIME_NAMES: [&'static str; 4] =
        ["no_verdict", "malformed", "no_such_port", "oversize"];

    /// The program's `i`-th reason. Programs have at most 48.
    pub const fn program(i: u8) -> DropReason {
        DropReason(Self::PROGRAM_BASE + i)
    }

    /// The name of this reason, given the program's list of names.
    pub fn name(self, program_reasons: &[&'static str]) -> &'static str {
        if self.0 < Self::PROGRAM_BASE {
            Self::RUNTIME_NAMES
                .get(usize::from(self.0))
                .copied()
                .unwrap_or("runtime_reserved")
        } else {
            program_reasons
                .get(usize::from(self.0 - Self::PROGRAM_BASE))
                .copied()
                .unwrap_or("program_unnamed")
        }
    }
}

/// What happens to a packet after the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send out of this port.
    Forward(PortId),
    /// Send a copy out of every port but the one it came in on (unknown destinations,
    /// broadcasts).
    Flood,
    /// Drop, for this reason.
    Drop(DropReason),
    /// Hand to the control plane (a packet-in), with a program-defined reason code.
    ToControl(u16),
}

impl Verdict {
    /// The ports this verdict sends a packet out of, for a packet that came in on
    /// `in_port` of a switch with `ports` ports. Every output stage (files, live queues,
    /// the benchmark's sink, the counters) goes through this one function.
    #[inline]
    pub fn out_ports(self, in_port: PortId, ports: usize) -> OutPorts {
        match self {
            Verdict::Forward(p) if usize::from(p) < ports => OutPorts {
                next: usize::from(p),
                end: usize::from(p) + 1,
                skip: usize::MAX,
            },
            Verdict::Flood => OutPorts {
                next: 0,
                end: ports,
                skip: usize::from(in_port),
            },
            _ => OutPorts {
                next: 0,
                end: 0,
                skip: usize::MAX,
            },
        }
    }
}

/// The output ports of a verdict, in port order (see [`Verdict::out_ports`]).
pub struct OutPorts {
    next: usize,
    end: usize,
    skip: usize,
}

impl Iterator for OutPorts {
    type Item = PortId;

    #[inline]
    fn next(&mut self) -> Option<PortId> {
        while self.next < self.end {
            let p = self.next;
            self.next += 1;
            if p != self.skip {
                return Some(p as PortId);
            }
        }
        None
    }
}

/// What the runtime tells a program about the burst it is processing.
pub struct Context {
    /// The data-plane clock: capture time offline, the system clock on live ports.
    pub now_ns: u64,
    /// This worker's index and the number of workers.
    pub worker: usize,
    pub workers: usize,
    /// The per-process flow hasher (for programs that hash other keys, e.g. symmetric).
    pub hasher: FlowHasher,
    /// How many ports the switch has; a `Forward` to a port at or past it is dropped.
    pub ports: usize,
}

/// A network function. See the module documentation for the contract.
pub trait Program: Send {
    /// Sets the verdict of every packet in `burst` (all of them parsed and well formed).
    fn process(&mut self, burst: &mut Burst, ctx: &mut Context);

    /// Called on live ports about once a millisecond with `out` empty and `ctx.now_ns` the
    /// wall clock: the program may push packets of its own (probes, notifications) into
    /// `out`, each with its verdict set. Offline runs never call it.
    fn poll(&mut self, _out: &mut Burst, _ctx: &mut Context) {}

    /// Names of the program's drop reasons, indexed by `DropReason::program(i)`.
    fn drop_reasons(&self) -> &'static [&'static str] {
        &[]
    }

    /// The tables and registers the program keeps, as the control plane sees them.
    fn declarations(&self) -> Vec<Declaration> {
        Vec::new()
    }

    /// Runs on the control plane's thread before `request` goes to the workers, for work
    /// too heavy to do between two bursts: an updated copy of a table the workers share,
    /// which each worker's `control` then takes (a pointer swap). A refusal here reaches
    /// no worker. Called on an instance of its own, made by the same factory.
    fn prepare(&self, _request: &Request) -> Result<Option<Prepared>, ControlError> {
        Ok(None)
    }

    /// Answers a control-plane request between two bursts, with what `prepare` made. The
    /// request has passed [`Declaration::check`] against `declarations()`; a refusal must
    /// change nothing.
    fn control(
        &mut self,
        request: &Request,
        _prepared: Option<&Prepared>,
        _ctx: &Context,
    ) -> Result<Reply, ControlError> {
        Err(ControlError::UnknownTable {
            name: request.target().to_string(),
            known: Vec::new(),
        })
    }

    /// Moves the program's pending notifications (idle timeouts, digests) into `out`.
    fn notifications(&mut self, _out: &mut Vec<Notification>) {}
}

/// What [`Program::prepare`] hands to every worker with a request.
pub type Prepared = std::sync::Arc<dyn std::any::Any + Send + Sync>;

/// Makes one program instance per worker (`worker index -> program`).
pub type ProgramFactory = std::sync::Arc<dyn Fn(usize) -> Box<dyn Program> + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_ports_of_each_verdict() {
        let all = |v: Verdict, in_port| v.out_ports(in_port, 4).collect::<Vec<_>>();
        assert_eq!(all(Verdict::Forward(2), 0), [2]);
        assert_eq!(all(Verdict::Forward(9), 0), [], "no such port: nowhere");
        assert_eq!(
            all(Verdict::Flood, 1),
            [0, 2, 3],
            "every port but the ingress"
        );
        assert_eq!(all(Verdict::Drop(DropReason::NO_VERDICT), 1), []);
        assert_eq!(all(Verdict::ToControl(1), 1), []);
    }
}
