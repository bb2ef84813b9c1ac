//! The state stages' tests' packets: bursts of one UDP flow, built as a port receives
//! them.

use stateplane_gen::build::{Hosts, L4, emit_frame};
use stateplane_runtime::Burst;
use stateplane_wire::MacAddr;

/// `n` packets of UDP flow `flow` (from 198.18.0.`flow` to 198.19.0.1) received on port
/// 0, on `vlan` (0: untagged).
pub fn udp_burst(vlan: u16, flow: u8, n: usize) -> Burst {
    let hosts = Hosts {
        src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        vlan,
        src: format!("198.18.0.{flow}").parse().unwrap(),
        dst: "198.19.0.1".parse().unwrap(),
        ttl: 64,
    };
    let mut frame = Vec::new();
    let udp = L4::Udp {
        src_port: 1000,
        dst_port: 53,
    };
    emit_frame(&mut frame, &hosts, &udp, b"x");
    let mut b = Burst::with_capacity(64);
    for i in 0..n {
        assert!(b.push(&frame, frame.len() as u32, i as u64, 0, i as u64));
    }
    b
}
