//! Keys of exact-match tables: fixed-size values hashed with a per-table random seed.

use stateplane_wire::FlowKey;

/// A key an exact table can hold: plain, fixed-size, hashed with a seed, all-zero bytes a
/// value of it (an empty table's slots are zeroed memory, never touched until used).
pub trait TableKey: Copy + Eq + Default + bytemuck::Zeroable + Send + 'static {
    fn hash_with(&self, seed: u64) -> u64;
}

/// The 64x64 -> 128 multiply folded to 64 bits: a fast, well-mixing step (as in the flow
/// hash).
#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a).wrapping_mul(u128::from(b));
    (p as u64) ^ ((p >> 64) as u64)
}

#[inline(always)]
fn mix(words: &[u64], seed: u64) -> u64 {
    let mut h = seed ^ 0x9e37_79b9_7f4a_7c15;
    for &w in words {
        h = fold(h ^ w, 0xa076_1d64_78bd_642f);
    }
    fold(h, seed | 1)
}

impl TableKey for u32 {
    #[inline]
    fn hash_with(&self, seed: u64) -> u64 {
        mix(&[u64::from(*self)], seed)
    }
}

impl TableKey for u64 {
    #[inline]
    fn hash_with(&self, seed: u64) -> u64 {
        mix(&[*self], seed)
    }
}

impl TableKey for u128 {
    #[inline]
    fn hash_with(&self, seed: u64) -> u64 {
        mix(&[*self as u64, (*self >> 64) as u64], seed)
    }
}

impl TableKey for FlowKey {
    #[inline]
    fn hash_with(&self, seed: u64) -> u64 {
        mix(&self.words(), seed)
    }
}
