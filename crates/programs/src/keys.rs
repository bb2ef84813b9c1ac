//! The declaration of a table the data plane fills.
//!
//! Owns: the declaration of a table the data plane fills ([`filled_table`]); the keys'
//! fields are the state crate's [`KeyFields`]. Must never: know any program's values.

pub(crate) use stateplane_state::KeyFields;
use stateplane_state::control::{Action, Field};
use stateplane_state::{Declaration, Guarantee, Kind};

/// A table the data plane fills and the control plane reads and deletes: keyed by `K`
/// (a single-field key named `key_name`), one action per name in `actions`, each with the
/// same `params`.
pub(crate) fn filled_table<K: KeyFields>(
    name: &str,
    key_name: &str,
    capacity: usize,
    actions: &[&str],
    params: Vec<Field>,
) -> Declaration {
    Declaration {
        name: name.to_string(),
        capacity,
        guarantees: vec![Guarantee::Local],
        kind: Kind::Table {
            key: K::declared(key_name),
            actions: actions
                .iter()
                .map(|&name| Action {
                    name: name.to_string(),
                    params: params.clone(),
                })
                .collect(),
            writable: false,
        },
    }
}
