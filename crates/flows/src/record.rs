//! Flow records as they leave the aggregator, and why they left.

use crate::flow_stats::FlowStats;
use stateplane_wire::FlowKey;

/// Why a flow record was exported: IPFIX's flowEndReason (IE 136) values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EndReason {
    /// No packet for the inactive timeout.
    Idle = 1,
    /// Open for the active timeout: exported, and its next packets start a new record.
    Active = 2,
    /// TCP FIN or RST.
    EndOfFlow = 3,
    /// The run ended.
    Forced = 4,
    /// The table was full: the flow was exported to make room.
    LackOfResources = 5,
}

impl EndReason {
    pub const ALL: [EndReason; 5] = [
        EndReason::Idle,
        EndReason::Active,
        EndReason::EndOfFlow,
        EndReason::Forced,
        EndReason::LackOfResources,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EndReason::Idle => "idle",
            EndReason::Active => "active",
            EndReason::EndOfFlow => "end_of_flow",
            EndReason::Forced => "forced",
            EndReason::LackOfResources => "lack_of_resources",
        }
    }
}

/// One exported flow: its key as the forward direction saw it, its features, and for a
/// biflow (RFC 5103) the reverse direction's features, if it sent anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowRecord {
    pub key: FlowKey,
    pub forward: FlowStats,
    pub reverse: Option<FlowStats>,
    pub end: EndReason,
}

impl FlowRecord {
    pub fn packets(&self) -> u64 {
        self.forward.packets + self.reverse.map_or(0, |r| r.packets)
    }

    pub fn bytes(&self) -> u64 {
        self.forward.bytes + self.reverse.map_or(0, |r| r.bytes)
    }
}
