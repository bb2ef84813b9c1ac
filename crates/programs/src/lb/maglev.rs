//! Maglev's consistent hashing (Eisenbud et al., NSDI 2016, section 3.4): a lookup table
//! of a prime number of slots, each naming a backend, filled so that every backend holds
//! nearly the same number of slots and a change of the backend set moves few of them.
//!
//! Owns: filling a table from backend identities. Must never: know about packets or
//! health (the caller passes the backends that are up).

/// A backend as the table sees it: what it is called in the table, its identity, which
/// alone decides its preferences (its place in the configuration does not), and its weight
/// (at least 1), to which its share of the slots is proportional.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub index: u16,
    pub identity: u64,
    pub weight: u16,
}

/// Two independent hashes of an identity: where a backend's preference list starts, and
/// its stride.
fn offset_and_skip(identity: u64, size: usize) -> (u64, u64) {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let m = size as u64;
    let offset = mix(identity ^ 0x6d61_676c_6576_0001) % m;
    let skip = mix(identity.rotate_left(29) ^ 0x6d61_676c_6576_0002) % (m - 1) + 1;
    (offset, skip)
}

/// The lookup table of `size` slots (a prime) for `members`: each takes, in turn, the
/// next slot of its preference list (a permutation of the slots, as `size` is prime) that
/// is still free, until every slot is taken. Empty when there are no members.
///
/// Weights: on each pass a member earns its weight in credit and takes a slot for every
/// largest weight's worth it holds (as Katran's weighted Maglev does), so the heaviest
/// members take one slot a pass and a member of half their weight one every other pass.
/// With equal weights every member takes one slot a pass: the paper's table.
pub fn populate(members: &[Member], size: usize) -> Vec<u16> {
    if members.is_empty() || size < 2 {
        return Vec::new();
    }
    // Members take turns in order of identity, so that the configuration's order of
    // backends does not matter.
    let mut members = members.to_vec();
    members.sort_by_key(|b| b.identity);
    let m = size as u64;
    let prefs: Vec<(u64, u64)> = members
        .iter()
        .map(|b| offset_and_skip(b.identity, size))
        .collect();
    let heaviest = u64::from(members.iter().map(|b| b.weight.max(1)).max().unwrap_or(1));
    let mut credit = vec![0u64; members.len()];
    let mut next = vec![0u64; members.len()];
    let mut table = vec![u16::MAX; size];
    let mut filled = 0;
    // Each pass gives the heaviest members one slot (so the fill ends); a member's walk
    // never revisits a slot, so it ends within `size` steps over the whole fill.
    loop {
        for (i, &(offset, skip)) in prefs.iter().enumerate() {
            credit[i] += u64::from(members[i].weight.max(1));
            if credit[i] < heaviest {
                continue;
            }
            credit[i] -= heaviest;
            let mut slot = ((offset + next[i] * skip) % m) as usize;
            while table[slot] != u16::MAX {
                next[i] += 1;
                slot = ((offset + next[i] * skip) % m) as usize;
            }
            table[slot] = members[i].index;
            next[i] += 1;
            filled += 1;
            if filled == size {
                return table;
            }
        }
    }
}

/// Whether `n` is prime (trial division: configuration sizes only).
pub fn is_prime(n: usize) -> bool {
    n >= 2
        && (2..)
            .take_while(|d| d * d <= n)
            .all(|d| !n.is_multiple_of(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: u16) -> Vec<Member> {
        (0..n)
            .map(|i| Member {
                index: i,
                identity: 0xc612_0000 + u64::from(i) * 7919,
                weight: 1,
            })
            .collect()
    }

    fn shares(table: &[u16], n: usize) -> Vec<usize> {
        let mut count = vec![0; n];
        for &b in table {
            count[usize::from(b)] += 1;
        }
        count
    }

    #[test]
    fn every_slot_is_taken_and_the_shares_are_nearly_equal() {
        for n in [1u16, 2, 3, 10, 100] {
            let table = populate(&members(n), 65_537);
            assert_eq!(table.len(), 65_537);
            let count = shares(&table, usize::from(n));
            let (lo, hi) = (count.iter().min().unwrap(), count.iter().max().unwrap());
            // Every member gets a slot per pass: the shares differ by at most one pass's
            // worth, the rounding of the last one.
            assert!(hi - lo <= 1, "{n} backends: shares from {lo} to {hi}");
        }
    }

    #[test]
    fn removing_a_backend_moves_its_slots_and_few_others() {
        let all = members(10);
        let before = populate(&all, 65_537);
        let without: Vec<Member> = all.iter().copied().filter(|m| m.index != 3).collect();
        let after = populate(&without, 65_537);
        assert!(after.iter().all(|&b| b != 3), "the removed backend is gone");
        let others = before.iter().filter(|&&b| b != 3).count();
        let moved = before
            .iter()
            .zip(&after)
            .filter(|&(&b, &a)| b != 3 && a != b)
            .count();
        // The paper measures a few percent of the other slots moving for tables this
        // much larger than the backend count; a modulo hash would move nine tenths.
        assert!(
            moved * 100 < others * 3,
            "{moved} of {others} slots of the other backends moved"
        );
    }

    #[test]
    fn shares_follow_the_weights() {
        let mut m = members(4);
        for (member, weight) in m.iter_mut().zip([1u16, 2, 3, 256]) {
            member.weight = weight;
        }
        let size = 65_537;
        let count = shares(&populate(&m, size), 4);
        let total: u64 = m.iter().map(|b| u64::from(b.weight)).sum();
        for (b, &got) in m.iter().zip(&count) {
            let want = size as f64 * f64::from(b.weight) / total as f64;
            assert!(
                (got as f64 - want).abs() <= want * 0.01 + 2.0,
                "weight {} holds {got} slots, {want:.0} expected ({count:?})",
                b.weight
            );
        }
    }

    #[test]
    fn reweighting_one_backend_moves_little_more_than_its_change() {
        let all = members(10);
        let before = populate(&all, 65_537);
        let mut heavier = all.clone();
        heavier[3].weight = 2;
        let after = populate(&heavier, 65_537);
        // Backend 3 goes from 1/10 to 2/11 of the slots: the least that can move is the
        // 8% it gains; Maglev moves a few percent more.
        let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
        let least = 65_537.0 * (2.0 / 11.0 - 1.0 / 10.0);
        assert!(
            (moved as f64) < least * 1.6,
            "{moved} slots moved, at least {least:.0} must"
        );
    }

    #[test]
    fn a_table_depends_on_the_identities_not_their_order() {
        let mut m = members(5);
        let a = populate(&m, 251);
        m.reverse();
        assert_eq!(a, populate(&m, 251));
        assert!(populate(&[], 251).is_empty());
    }

    #[test]
    fn primes() {
        let found: Vec<usize> = (0..30).filter(|&n| is_prime(n)).collect();
        assert_eq!(found, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
        assert!(is_prime(65_537) && !is_prime(65_536));
    }
}
