//! Applies a walk's actions to the packet itself: field rewrites (checksums kept valid by
//! `wire::edit`), TTL decrements, and the frame's net VLAN change, which the caller makes
//! with the frame's headroom (a push grows the frame).

use crate::rule::{Action, SetField};
use stateplane_wire::edit::{self, EditError, Side};
use stateplane_wire::{MacAddr, ParseFlags, Parsed};

/// The outer VLAN tag after the actions, against the frame as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VlanChange {
    Keep,
    /// Tag with this id: rewrite the outer tag's id, or add a tag to an untagged frame.
    Set(u16),
    Pop,
}

/// What the actions leave for the caller: where the packet goes, and the VLAN change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// The last output applied; `None`: the packet is dropped.
    pub output: Option<u16>,
    pub controller: bool,
    pub vlan: VlanChange,
}

/// Why the actions could not be applied to this packet (it is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyError {
    TtlExpired,
    /// A set-field the packet has no field for (a port on ICMP, an IPv4 address on IPv6).
    CannotEdit(EditError),
}

impl From<EditError> for ApplyError {
    fn from(e: EditError) -> Self {
        match e {
            EditError::TtlExpired => ApplyError::TtlExpired,
            other => ApplyError::CannotEdit(other),
        }
    }
}

/// Rewrites `frame` (parsed as `parsed`) by `actions`, in order. On an error the packet is
/// to be dropped; edits made before it may remain.
pub fn apply(frame: &mut [u8], parsed: &Parsed, actions: &[Action]) -> Result<Applied, ApplyError> {
    let was_tagged = parsed.flags.has(ParseFlags::VLAN);
    let (mut tagged, mut new_id) = (was_tagged, None);
    let mut applied = Applied {
        output: None,
        controller: false,
        vlan: VlanChange::Keep,
    };
    for action in actions {
        match *action {
            Action::Output(port) => applied.output = Some(port),
            Action::Controller => applied.controller = true,
            Action::DecTtl => edit::dec_ttl(frame, parsed)?,
            Action::PushVlan(id) => (tagged, new_id) = (true, Some(id)),
            Action::PopVlan => (tagged, new_id) = (false, None),
            Action::Set(SetField::EthDst(mac)) => set_mac(frame, 0, mac)?,
            Action::Set(SetField::EthSrc(mac)) => set_mac(frame, 6, mac)?,
            Action::Set(SetField::IpSrc(a)) => set_ip(frame, parsed, Side::Src, a)?,
            Action::Set(SetField::IpDst(a)) => set_ip(frame, parsed, Side::Dst, a)?,
            Action::Set(SetField::TpSrc(p)) => edit::set_port(frame, parsed, Side::Src, p)?,
            Action::Set(SetField::TpDst(p)) => edit::set_port(frame, parsed, Side::Dst, p)?,
        }
    }
    applied.vlan = match (was_tagged, tagged, new_id) {
        (_, true, Some(id)) => VlanChange::Set(id),
        (true, false, _) => VlanChange::Pop,
        _ => VlanChange::Keep,
    };
    Ok(applied)
}

fn set_mac(frame: &mut [u8], at: usize, mac: u64) -> Result<(), EditError> {
    let dst = frame.get_mut(at..at + 6).ok_or(EditError::Truncated)?;
    dst.copy_from_slice(&MacAddr::from_u64(mac).0);
    Ok(())
}

/// An address in the rules' 128-bit form onto the packet's family: IPv4 as the mapped
/// `::ffff:a.b.c.d`.
fn set_ip(frame: &mut [u8], parsed: &Parsed, side: Side, a: u128) -> Result<(), EditError> {
    if parsed.flags.has(ParseFlags::IPV4) {
        if a >> 32 != 0xffff {
            return Err(EditError::WrongFamily);
        }
        edit::set_ip_addr(frame, parsed, side, &(a as u32).to_be_bytes())
    } else {
        edit::set_ip_addr(frame, parsed, side, &a.to_be_bytes())
    }
}
