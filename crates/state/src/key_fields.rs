//! How table keys look to the control plane: [`KeyFields`] for every key type a program's
//! table uses (flow keys: the 5-tuple and VLAN; single integers and addresses), so that a
//! codec says what its values are and nothing about its keys ([`crate::ValueCodec`]).

use crate::synced_table::MAX_FIELDS;
use crate::table_key::TableKey;
use stateplane_api::{Field, Format, Match, ip_addr, ip_value};
use stateplane_wire::FlowKey;
use std::net::{IpAddr, Ipv6Addr};

/// A table key with its fields in the control API.
pub trait KeyFields: TableKey {
    /// The key's fields in a declaration; a single-field key is named `name`.
    fn declared(name: &str) -> Vec<Field>;
    /// The key of checked fields (`Declaration::check` passed them).
    fn of(fields: &[Match]) -> Self {
        // No key type has more fields than a synced slot may hold (a flow has six).
        let mut values = [0; MAX_FIELDS];
        for (i, v) in values.iter_mut().enumerate() {
            *v = exact(fields, i);
        }
        Self::of_values(&values)
    }
    /// The key of its fields' exact values, in order, checked as [`KeyFields::of`]'s (a
    /// synced table's slots decoded, with no [`Match`] made a field: a migration places
    /// tens of thousands). A field missing is 0.
    fn of_values(values: &[u128]) -> Self;
    fn fields(&self) -> Vec<Match>;
    /// The fields' values into `out` (as many as declared), as [`KeyFields::fields`] has
    /// them; with no allocation where the key overrides it (a synced table encodes every
    /// slot it finds changed).
    fn values(&self, out: &mut [u128]) {
        for (o, m) in out.iter_mut().zip(self.fields()) {
            *o = match m {
                Match::Exact(v) => v,
                _ => 0,
            };
        }
    }
}

/// The exact value of field `i`, 0 if missing (checked fields never miss).
fn exact(fields: &[Match], i: usize) -> u128 {
    match fields.get(i) {
        Some(Match::Exact(v)) => *v,
        _ => 0,
    }
}

/// Flows: `src dst proto src_port dst_port vlan`, addresses as `Format::Ip`.
impl KeyFields for FlowKey {
    fn declared(_name: &str) -> Vec<Field> {
        vec![
            Field::exact("src", 128, Format::Ip),
            Field::exact("dst", 128, Format::Ip),
            Field::exact("proto", 8, Format::Int),
            Field::exact("src_port", 16, Format::Int),
            Field::exact("dst_port", 16, Format::Int),
            Field::exact("vlan", 12, Format::Int),
        ]
    }

    fn of_values(values: &[u128]) -> Self {
        let f = |i| values.get(i).copied().unwrap_or(0);
        let (src, dst) = (ip_addr(f(0)), ip_addr(f(1)));
        let mut key = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                FlowKey::v4(s, d, f(2) as u8, f(3) as u16, f(4) as u16)
            }
            _ => FlowKey::v6(
                Ipv6Addr::from(f(0)),
                Ipv6Addr::from(f(1)),
                f(2) as u8,
                f(3) as u16,
                f(4) as u16,
            ),
        };
        key.vlan = f(5) as u16;
        key
    }

    fn fields(&self) -> Vec<Match> {
        let mut values = [0; 6];
        self.values(&mut values);
        values.into_iter().map(Match::Exact).collect()
    }

    fn values(&self, out: &mut [u128]) {
        let ip = |a: Option<IpAddr>| a.map_or(0, ip_value);
        let values = [
            ip(self.src_ip()),
            ip(self.dst_ip()),
            u128::from(self.proto),
            u128::from(self.src_port),
            u128::from(self.dst_port),
            u128::from(self.vlan),
        ];
        for (o, v) in out.iter_mut().zip(values) {
            *o = v;
        }
    }
}

/// Single integers (`u32`, `u64`) and addresses (`u128`, `Format::Ip`: IPv4 mapped).
macro_rules! single_field_key {
    ($($t:ty => $bits:expr, $format:expr);+ $(;)?) => {$(
        impl KeyFields for $t {
            fn declared(name: &str) -> Vec<Field> {
                vec![Field::exact(name, $bits, $format)]
            }

            fn of_values(values: &[u128]) -> Self {
                values.first().copied().unwrap_or(0) as $t
            }

            fn fields(&self) -> Vec<Match> {
                vec![Match::Exact(u128::from(*self))]
            }
        }
    )+};
}

single_field_key! {
    u32 => 32, Format::Int;
    u64 => 64, Format::Int;
    u128 => 128, Format::Ip;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_back_from_their_fields() {
        let v4 = FlowKey {
            vlan: 7,
            ..FlowKey::v4(
                "198.18.0.1".parse().unwrap(),
                "198.19.0.2".parse().unwrap(),
                6,
                40_000,
                80,
            )
        };
        let v6 = FlowKey::v6(
            "2001:2::1".parse().unwrap(),
            "2001:2::2".parse().unwrap(),
            17,
            53,
            5353,
        );
        for k in [v4, v6] {
            assert_eq!(FlowKey::of(&k.fields()), k);
            let mut values = [0; 6];
            k.values(&mut values);
            assert_eq!(
                FlowKey::of_values(&values),
                k,
                "as a synced slot's words decode"
            );
        }
        assert_eq!(u32::of(&0xdead_beef_u32.fields()), 0xdead_beef);
        assert_eq!(u32::of_values(&[0xdead_beef]), 0xdead_beef);
        assert_eq!(u64::of(&u64::MAX.fields()), u64::MAX);
        assert_eq!(u128::of_values(&[]), 0, "a field missing is 0");
        assert_eq!(u128::declared("dst")[0].name, "dst");
    }
}
