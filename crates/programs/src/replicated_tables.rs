//! Exact tables as replicated state: a program whose table may be configured `replicated`
//! answers the replication stage with its [`DeclaredTable`](stateplane_state::DeclaredTable)'s
//! entry of a packet's flow, by the key the program reads that entry with.
//!
//! Must never: be used by a program that keeps state derived from the table beside it
//! (a reverse index, a port pool): an entry installed by the table alone would leave that
//! state behind.

use stateplane_runtime::FlowBytes;
use stateplane_wire::FlowKey;

/// A table key as a replicated flow's name in the store, and back.
pub(crate) trait ReplicatedKey: Sized {
    fn to_flow_bytes(&self) -> Option<FlowBytes>;
    fn from_flow_bytes(bytes: &FlowBytes) -> Option<Self>;
}

impl ReplicatedKey for FlowKey {
    fn to_flow_bytes(&self) -> Option<FlowBytes> {
        FlowBytes::new(&self.to_bytes())
    }

    fn from_flow_bytes(bytes: &FlowBytes) -> Option<Self> {
        FlowKey::from_bytes(bytes.as_bytes())
    }
}

impl ReplicatedKey for u64 {
    fn to_flow_bytes(&self) -> Option<FlowBytes> {
        FlowBytes::new(&self.to_be_bytes())
    }

    fn from_flow_bytes(bytes: &FlowBytes) -> Option<Self> {
        Some(u64::from_be_bytes(bytes.as_bytes().try_into().ok()?))
    }
}

/// The `Program` methods by which the replication stage sets the lease marks of a
/// replicated table whose program looks its entries up with
/// `DeclaredTable::lookup_leased` (`Program::check_leases`). `$key_of_flow(&FlowBytes)`
/// is the table key a flow names (`None`: none, an alias), `$flow_of_key(&key)` the flow
/// a table key is; a key with no name as a flow is one `replicated_key` names none for
/// either: its packets are of no flow.
macro_rules! leased_table_methods {
    ($($table:ident).+, key_of_flow: $key_of_flow:path, flow_of_key: $flow_of_key:path) => {
        fn check_leases(&mut self) -> bool {
            self.$($table).+.check_leases()
        }

        fn mark_leased(&mut self, flow: &stateplane_runtime::FlowBytes, until_ns: Option<u64>) {
            if let Some(key) = $key_of_flow(flow) {
                self.$($table).+.mark_leased(&key, until_ns);
            }
        }

        fn set_lease_clock(&mut self, now_ns: u64) {
            self.$($table).+.set_lease_clock(now_ns);
        }

        fn clear_leases(&mut self) {
            self.$($table).+.clear_leases();
        }

        fn take_leased_changes(
            &mut self,
            every: bool,
            out: &mut Vec<stateplane_runtime::LeasedPacket>,
        ) -> u64 {
            self.$($table).+.take_leased_changes(every, |key, place, changed| {
                if let Some(flow) = $flow_of_key(key) {
                    out.push(stateplane_runtime::LeasedPacket { flow, place, changed });
                }
            })
        }
    };
}

/// Inside a program's `impl Program`: the replicated-state methods of a program whose one
/// table at `self.$table` may be replicated, its counting parameters with it or not
/// (`$with_counts`, see `DeclaredTable::replicate`). `self.$key_of(packet, data)` is the
/// table key of the entry a packet reads or writes (`None`: none), from the packet alone,
/// the same for every packet of a flow whichever way it travels.
///
/// With `leases_checked`, the program looks its packets' entries up with
/// `DeclaredTable::lookup_leased` wherever it reads or writes them, and the table's lease
/// marks are the replication stage's to set (`Program::check_leases`).
macro_rules! replicated_table_methods {
    ($($table:ident).+, with_counts: $with_counts:expr, key: $key_of:ident, leases_checked) => {
        crate::replicated_tables::replicated_table_methods!(
            $($table).+, with_counts: $with_counts, key: $key_of
        );

        crate::replicated_tables::leased_table_methods!(
            $($table).+,
            key_of_flow: crate::replicated_tables::ReplicatedKey::from_flow_bytes,
            flow_of_key: crate::replicated_tables::ReplicatedKey::to_flow_bytes
        );
    };
    ($($table:ident).+, with_counts: $with_counts:expr, key: $key_of:ident) => {
        fn replicate(&mut self, name: &str) -> bool {
            self.$($table).+.replicate(name, $with_counts)
        }

        fn replicated_key(
            &self,
            packet: &stateplane_runtime::PacketDesc,
            data: &[u8],
        ) -> Option<stateplane_runtime::FlowBytes> {
            if !self.$($table).+.replicated() {
                return None;
            }
            let key = self.$key_of(packet, data)?;
            crate::replicated_tables::ReplicatedKey::to_flow_bytes(&key)
        }

        fn replicated_state(&self, key: &stateplane_runtime::FlowBytes) -> Option<Vec<u8>> {
            stateplane_runtime::state_alone(|out, hint| self.replicated_state_into(key, out, hint))
        }

        fn replicated_state_into(
            &self,
            key: &stateplane_runtime::FlowBytes,
            out: &mut Vec<u8>,
            hint: &mut u32,
        ) -> Option<u64> {
            crate::replicated_tables::ReplicatedKey::from_flow_bytes(key)
                .and_then(|key| self.$($table).+.replicated_state_into(&key, out, hint))
        }

        fn install_replicated(
            &mut self,
            key: &stateplane_runtime::FlowBytes,
            state: Option<&[u8]>,
            now_ns: u64,
        ) -> bool {
            crate::replicated_tables::ReplicatedKey::from_flow_bytes(key)
                .is_some_and(|key| self.$($table).+.install_replicated(key, state, now_ns))
        }
    };
}
pub(crate) use {leased_table_methods, replicated_table_methods};
