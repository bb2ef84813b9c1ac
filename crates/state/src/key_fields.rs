//! How table keys look to the control plane: [`KeyFields`] for every key type a program's
//! table uses (flow keys: the 5-tuple and VLAN; single integers and addresses), so that a
//! codec says what its values are and nothing about its keys ([`crate::ValueCodec`]).

use crate::synced_table::MAX_FIELDS;
use crate::table_key::TableKey;
use stateplane_api::{Field, Format, Match, ip_value};
use stateplane_wire::FlowKey;
use std::net::IpAddr;

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
        let (src, dst) = (f(0), f(1));
        // IPv4-mapped (::ffff:a.b.c.d): both, or the key is an IPv6 flow's.
        let mapped = |v: u128| v >> 32 == 0xffff;
        let (addresses, ip_version) = if mapped(src) && mapped(dst) {
            // `FlowKey::v4`'s layout, the address's four bytes first and the rest 0, made
            // in a register and stored whole: `FlowKey::v4` stores the four bytes into
            // zeroes, which a copy of the key then reads back before they have landed (a
            // stall a key of a migration's tens of thousands).
            let v4 = |v: u128| u128::from((v as u32).swap_bytes()).to_le_bytes();
            ((v4(src), v4(dst)), 4)
        } else {
            ((src.to_be_bytes(), dst.to_be_bytes()), 6)
        };
        FlowKey {
            src: addresses.0,
            dst: addresses.1,
            src_port: f(3) as u16,
            dst_port: f(4) as u16,
            vlan: f(5) as u16,
            in_port: 0,
            proto: f(2) as u8,
            ip_version,
        }
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

    /// A flow key made from a synced slot's field values is the one its addresses make
    /// as addresses (`ip_addr`): an IPv4 flow's where both are IPv4-mapped, an IPv6
    /// flow's otherwise, at every edge of the mapped range, each field cut to its width.
    #[test]
    fn a_flow_key_of_field_values_is_the_one_its_addresses_make() {
        use std::net::Ipv6Addr;
        let mapped = |v4: u32| (0xffff_u128 << 32) | u128::from(v4);
        let addresses = [
            0,
            1,
            mapped(0),
            mapped(0xc612_0001),
            mapped(u32::MAX),
            (0xffff_u128 << 32) - 1,
            0x1_ffff_u128 << 32,
            0x2001_0002_u128 << 96 | 1,
            u128::MAX,
        ];
        for (&src, &dst) in addresses
            .iter()
            .flat_map(|a| addresses.iter().map(move |b| (a, b)))
        {
            for (proto, ports, vlan) in [
                (6, (40_000, 80), 7),
                (255, (65_535, 0), 4_095),
                (17, (1, 2), 0),
            ] {
                let (proto, ports, vlan): (u128, (u128, u128), u128) = (proto, ports, vlan);
                let values = [src, dst, proto, ports.0, ports.1, vlan];
                let args = (proto as u8, ports.0 as u16, ports.1 as u16);
                let mut want = match (stateplane_api::ip_addr(src), stateplane_api::ip_addr(dst)) {
                    (IpAddr::V4(s), IpAddr::V4(d)) => FlowKey::v4(s, d, args.0, args.1, args.2),
                    _ => FlowKey::v6(
                        Ipv6Addr::from(src),
                        Ipv6Addr::from(dst),
                        args.0,
                        args.1,
                        args.2,
                    ),
                };
                want.vlan = vlan as u16;
                assert_eq!(FlowKey::of_values(&values), want, "{src:#x} {dst:#x}");
            }
        }
    }

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
