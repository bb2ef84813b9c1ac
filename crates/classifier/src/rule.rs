//! Rules: a pattern over [`Fields`], a priority, a cookie, timeouts, and instructions.

use crate::fields::Fields;

/// What a rule matches: each field under a mask (mask 0: any value; the value is kept
/// masked), transport ports as inclusive ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pattern {
    pub value: Fields,
    /// `tp_src` and `tp_dst` are unused here: ports match by range.
    pub mask: Fields,
    pub tp_src: (u16, u16),
    pub tp_dst: (u16, u16),
}

impl Pattern {
    /// Matches every packet.
    pub const ANY: Pattern = Pattern {
        value: ZERO,
        mask: ZERO,
        tp_src: (0, u16::MAX),
        tp_dst: (0, u16::MAX),
    };

    /// Whether the packet's fields match.
    #[inline]
    pub fn matches(&self, f: &Fields) -> bool {
        let (v, m) = (&self.value, &self.mask);
        f.in_port & m.in_port == v.in_port
            && f.eth_src & m.eth_src == v.eth_src
            && f.eth_dst & m.eth_dst == v.eth_dst
            && f.vlan & m.vlan == v.vlan
            && f.eth_type & m.eth_type == v.eth_type
            && f.ip_src & m.ip_src == v.ip_src
            && f.ip_dst & m.ip_dst == v.ip_dst
            && f.ip_proto & m.ip_proto == v.ip_proto
            && f.tcp_flags & m.tcp_flags == v.tcp_flags
            && (self.tp_src.0..=self.tp_src.1).contains(&f.tp_src)
            && (self.tp_dst.0..=self.tp_dst.1).contains(&f.tp_dst)
    }

    /// Whether some packet can match both patterns.
    pub fn overlaps(&self, b: &Pattern) -> bool {
        let a = self;
        let (av, am, bv, bm) = (&a.value, &a.mask, &b.value, &b.mask);
        macro_rules! agree {
            ($f:ident) => {
                (av.$f ^ bv.$f) & am.$f & bm.$f == 0
            };
        }
        agree!(in_port)
            && agree!(eth_src)
            && agree!(eth_dst)
            && agree!(vlan)
            && agree!(eth_type)
            && agree!(ip_src)
            && agree!(ip_dst)
            && agree!(ip_proto)
            && agree!(tcp_flags)
            && a.tp_src.0 <= b.tp_src.1
            && b.tp_src.0 <= a.tp_src.1
            && a.tp_dst.0 <= b.tp_dst.1
            && b.tp_dst.0 <= a.tp_dst.1
    }

    /// The bits of a packet's fields that can decide whether it matches: the mask, and
    /// all of a port whose range is not every port.
    pub fn key_bits(&self) -> Fields {
        let all = |range: (u16, u16)| if range == (0, u16::MAX) { 0 } else { u16::MAX };
        Fields {
            tp_src: all(self.tp_src),
            tp_dst: all(self.tp_dst),
            ..self.mask
        }
    }

    /// Keeps `value` within `mask` (bits outside a mask never matter).
    pub fn normalized(mut self) -> Pattern {
        self.value = self.value.masked(&self.mask);
        self
    }
}

const ZERO: Fields = Fields {
    in_port: 0,
    eth_src: 0,
    eth_dst: 0,
    vlan: 0,
    eth_type: 0,
    ip_src: 0,
    ip_dst: 0,
    ip_proto: 0,
    tp_src: 0,
    tp_dst: 0,
    tcp_flags: 0,
};

/// A field an action can set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetField {
    EthSrc(u64),
    EthDst(u64),
    IpSrc(u128),
    IpDst(u128),
    TpSrc(u16),
    TpDst(u16),
}

/// One action of an apply-actions instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Output(u16),
    /// Hand the packet to the control plane.
    Controller,
    Set(SetField),
    /// Push (or replace) a VLAN tag with this id.
    PushVlan(u16),
    PopVlan,
    DecTtl,
}

impl Action {
    /// What the action does to the fields later tables match on.
    pub fn apply(&self, f: &mut Fields) {
        match *self {
            Action::Set(SetField::EthSrc(v)) => f.eth_src = v,
            Action::Set(SetField::EthDst(v)) => f.eth_dst = v,
            Action::Set(SetField::IpSrc(v)) => f.ip_src = v,
            Action::Set(SetField::IpDst(v)) => f.ip_dst = v,
            Action::Set(SetField::TpSrc(v)) => f.tp_src = v,
            Action::Set(SetField::TpDst(v)) => f.tp_dst = v,
            Action::PushVlan(id) => f.vlan = id,
            Action::PopVlan => f.vlan = 0,
            Action::Output(_) | Action::Controller | Action::DecTtl => {}
        }
    }
}

/// A rule of a table. With no output and no goto, a matching packet is dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub table: u8,
    /// Higher wins; among equal priorities the rule added first.
    pub priority: u16,
    pub cookie: u64,
    pub pattern: Pattern,
    pub actions: Vec<Action>,
    /// A later table to continue in.
    pub goto: Option<u8>,
    /// Seconds without a hit, and seconds since added, after which the rule expires
    /// (0: never).
    pub idle_timeout: u32,
    pub hard_timeout: u32,
}
