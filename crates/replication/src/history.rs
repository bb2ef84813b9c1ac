//! Per-flow histories and a linearizability checker for them.
//!
//! A history is, per flow, the packets that came in: each with its input, the time it
//! came (`call`) and, if its output left, the output and the time it left (`ret`). A
//! packet whose output never left may or may not have taken effect (the paper's
//! definition 3 allows both: a packet lost on its way in or out), so it is checked as an
//! operation that returns at the end of time with any output.
//!
//! The check is Wing and Gong's search with Lowe's memo (as Porcupine does it): take, at
//! each step, an operation that may come first (its call before every return not yet
//! taken), apply it to the model, and backtrack when its output differs; a set of taken
//! operations with a state already seen is not searched again. Operations whose outputs
//! never left, or whose outputs say nothing of the state, are interchangeable when their
//! inputs are equal and one's call and return come no later than the other's, so of those
//! only the earlier is tried first: without it, a flow with many packets lost on the way
//! out, or many in flight at once whose states were not kept, makes the search
//! exponential.
//! Linearizability is local, so each flow is checked alone.
//!
//! Must never: accept a history that no order of the model explains (the tests give it
//! ones with a lost acknowledged write and with outputs from stale state).

use std::collections::HashSet;
use std::hash::Hash;

/// A sequential specification: the program, as a function of a flow's state and a packet.
pub trait Model {
    type State: Clone + Eq + Hash;
    type Input: PartialEq;
    type Output: PartialEq;
    fn init(&self) -> Self::State;
    fn step(&self, state: &Self::State, input: &Self::Input) -> (Self::State, Self::Output);

    /// Whether a recorded output says anything of the state (a history may record an
    /// output that agrees with every one: a packet whose state was not kept).
    fn reveals(&self, _output: &Self::Output) -> bool {
        true
    }
}

/// A flow's packet counter, the worst case of replication (most packets write): `true`
/// counts the packet, `false` only reads; the output is the count after. The model of the
/// simulation and of this module's tests.
pub struct PacketCounter;

impl Model for PacketCounter {
    type State = u64;
    type Input = bool;
    type Output = u64;
    fn init(&self) -> u64 {
        0
    }
    fn step(&self, s: &u64, count: &bool) -> (u64, u64) {
        let n = s + u64::from(*count);
        (n, n)
    }
}

/// One packet of a flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation<I, O> {
    pub input: I,
    pub call: u64,
    /// `None`: its output never left.
    pub ret: Option<(u64, O)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order explains the history; `explained` is the most operations any order
    /// managed to take before failing.
    NotLinearizable {
        explained: usize,
    },
    /// The search gave up after `steps` steps: neither verdict holds.
    Unknown {
        steps: u64,
    },
}

/// Checks one flow's history against `model`, in at most `max_steps` search steps.
pub fn check<M: Model>(
    model: &M,
    ops: &[Operation<M::Input, M::Output>],
    max_steps: u64,
) -> Verdict {
    let n = ops.len();
    // Events in time order, calls before returns at the same time (they may then have
    // happened together). An output that never left returns after everything.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, op) in ops.iter().enumerate() {
        events.push((op.call, false, i));
        events.push((op.ret.as_ref().map_or(u64::MAX, |r| r.0), true, i));
    }
    events.sort_by_key(|&(t, is_return, i)| (t, is_return, i));
    let mut list = Links::new(&events);
    // For an operation whose output says nothing (it never left, or tells nothing of the
    // state), the latest one before it (by call) that says nothing, has the same input and
    // returned no later: it may be taken only once that one is. Two such operations can
    // trade places in any order that explains the history, so trying only one of the two
    // orders loses nothing.
    let blind = |i: usize| ops[i].ret.as_ref().is_none_or(|(_, o)| !model.reveals(o));
    let ret_of = |i: usize| ops[i].ret.as_ref().map_or(u64::MAX, |r| r.0);
    let mut by_call: Vec<usize> = (0..n).filter(|&i| blind(i)).collect();
    by_call.sort_by_key(|&i| (ops[i].call, i));
    let mut open_before = vec![None; n];
    for (k, &i) in by_call.iter().enumerate() {
        // A bounded look back keeps this linear; a pair not found is only searched more.
        open_before[i] = (by_call[..k].iter().rev().copied())
            .filter(|&j| ops[j].input == ops[i].input)
            .take(64)
            .find(|&j| ret_of(j) <= ret_of(i));
    }

    let mut state = model.init();
    let mut taken = vec![0u64; n.div_ceil(64)];
    let mut seen: HashSet<(Vec<u64>, M::State)> = HashSet::new();
    // (event index of the call taken, state before it, the round it was taken in)
    let mut stack: Vec<(usize, M::State, bool)> = Vec::new();
    let mut explained = 0;
    let mut steps = 0u64;
    let mut at = list.first();
    // Each step's candidates are tried in two rounds: first the operations whose outputs
    // left, then those whose outputs never did. Most of the latter took no effect, and
    // trying them only when the others cannot go on keeps a correct history's search
    // short; both rounds together are the whole search.
    let mut open_round = false;
    loop {
        let Some(e) = at else {
            return Verdict::Linearizable;
        };
        steps += 1;
        if steps > max_steps {
            return Verdict::Unknown { steps };
        }
        let (_, is_return, op) = events[e];
        let stands_in = |op: usize| taken[op / 64] & (1 << (op % 64)) == 0;
        let open = ops[op].ret.is_none();
        if !is_return && (open != open_round || open_before[op].is_some_and(stands_in)) {
            at = list.next[e];
        } else if !is_return {
            let (next, out) = model.step(&state, &ops[op].input);
            let matches = ops[op].ret.as_ref().is_none_or(|(_, o)| *o == out);
            if matches {
                taken[op / 64] |= 1 << (op % 64);
                if seen.insert((taken.clone(), next.clone())) {
                    stack.push((e, std::mem::replace(&mut state, next), open_round));
                    explained = explained.max(stack.len());
                    list.lift(e, list.partner[e]);
                    at = list.first();
                    open_round = false;
                    continue;
                }
                taken[op / 64] &= !(1 << (op % 64));
            }
            at = list.next[e];
        } else if !open_round {
            open_round = true;
            at = list.first();
        } else {
            // A return reached: its operation had to be taken before; undo the last step.
            let Some((call, before, round)) = stack.pop() else {
                return Verdict::NotLinearizable { explained };
            };
            let op = events[call].2;
            taken[op / 64] &= !(1 << (op % 64));
            state = before;
            list.unlift(call, list.partner[call]);
            at = list.next[call];
            open_round = round;
        }
    }
}

/// The events as a doubly linked list from which an operation's call and return are
/// lifted out when it is taken, and put back, in place, when the search backtracks.
struct Links {
    next: Vec<Option<usize>>,
    prev: Vec<Option<usize>>,
    /// The other event of the same operation.
    partner: Vec<usize>,
    head: Option<usize>,
}

impl Links {
    fn new(events: &[(u64, bool, usize)]) -> Links {
        let n = events.len();
        let mut partner = vec![0; n];
        let mut call_of = vec![usize::MAX; n / 2];
        for (i, &(_, is_return, op)) in events.iter().enumerate() {
            if is_return {
                partner[i] = call_of[op];
                partner[call_of[op]] = i;
            } else {
                call_of[op] = i;
            }
        }
        Links {
            next: (0..n).map(|i| (i + 1 < n).then_some(i + 1)).collect(),
            prev: (0..n).map(|i| i.checked_sub(1)).collect(),
            partner,
            head: (n > 0).then_some(0),
        }
    }

    fn first(&self) -> Option<usize> {
        self.head
    }

    fn unlink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        match p {
            Some(p) => self.next[p] = n,
            None => self.head = n,
        }
        if let Some(n) = n {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        match p {
            Some(p) => self.next[p] = Some(e),
            None => self.head = Some(e),
        }
        if let Some(n) = n {
            self.prev[n] = Some(e);
        }
    }

    /// Takes out a call and its return (the return comes after the call).
    fn lift(&mut self, call: usize, ret: usize) {
        self.unlink(call);
        self.unlink(ret);
    }

    /// Puts back what [`Links::lift`] took out, in reverse order.
    fn unlift(&mut self, call: usize, ret: usize) {
        self.relink(ret);
        self.relink(call);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use PacketCounter as Counter;

    fn op(input: bool, call: u64, ret: Option<(u64, u64)>) -> Operation<bool, u64> {
        Operation { input, call, ret }
    }

    #[test]
    fn overlapping_operations_may_take_either_order() {
        let h = [op(true, 0, Some((10, 2))), op(true, 1, Some((5, 1)))];
        assert_eq!(check(&Counter, &h, 1000), Verdict::Linearizable);
    }

    #[test]
    fn a_lost_acknowledged_write_is_caught() {
        // The first count's output left (1); a read after it says 0.
        let h = [op(true, 0, Some((1, 1))), op(false, 2, Some((3, 0)))];
        assert!(matches!(
            check(&Counter, &h, 1000),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn two_counts_seeing_the_same_state_are_caught() {
        // Two switches each took the flow from the same state: both say 5.
        let mut h: Vec<_> = (0..4)
            .map(|i| op(true, 2 * i, Some((2 * i + 1, i + 1))))
            .collect();
        h.push(op(true, 10, Some((12, 5))));
        h.push(op(true, 11, Some((13, 5))));
        assert!(matches!(
            check(&Counter, &h, 10_000),
            Verdict::NotLinearizable { explained: 5 }
        ));
    }

    #[test]
    fn outputs_that_never_left_may_or_may_not_have_taken_effect() {
        // A count lost on its way out took effect; another never did.
        let h = [
            op(true, 0, None),
            op(true, 1, None),
            op(false, 5, Some((6, 1))),
            op(true, 7, Some((8, 2))),
        ];
        assert_eq!(check(&Counter, &h, 1000), Verdict::Linearizable);
        // But not after a read that came later had to see it: 2 then 1 is no order.
        let h = [
            op(true, 0, Some((1, 1))),
            op(false, 2, Some((3, 1))),
            op(true, 4, None),
            op(false, 6, Some((7, 2))),
            op(false, 8, Some((9, 1))),
        ];
        assert!(matches!(
            check(&Counter, &h, 1000),
            Verdict::NotLinearizable { .. }
        ));
    }

    /// A byte counter whose outputs are kept for some packets only (`None` agrees with
    /// every count), as a switch's history keeps a flow's state for a burst's last packet.
    struct Bytes;

    #[derive(Clone, Copy, Debug)]
    struct Kept(Option<u64>);

    impl PartialEq for Kept {
        fn eq(&self, other: &Kept) -> bool {
            self.0.zip(other.0).is_none_or(|(a, b)| a == b)
        }
    }

    impl Model for Bytes {
        type State = u64;
        type Input = u64;
        type Output = Kept;
        fn init(&self) -> u64 {
            0
        }
        fn step(&self, s: &u64, len: &u64) -> (u64, Kept) {
            (s + len, Kept(Some(s + len)))
        }
        fn reveals(&self, output: &Kept) -> bool {
            output.0.is_some()
        }
    }

    /// 200 packets of two sizes, each in flight with the 20 after it; every tenth keeps
    /// its count, the others none; `off` is added to the counts kept from the 100th on.
    fn pipelined(off: u64) -> Vec<Operation<u64, Kept>> {
        let mut total = 0;
        (0..200u64)
            .map(|i| {
                let len = if i % 3 == 0 { 1500 } else { 60 };
                total += len;
                let kept = (i % 10 == 9).then_some(total + if i >= 100 { off } else { 0 });
                Operation {
                    input: len,
                    call: i,
                    ret: Some((i + 20, Kept(kept))),
                }
            })
            .collect()
    }

    #[test]
    fn packets_in_flight_whose_outputs_say_nothing_are_searched_in_one_order() {
        assert_eq!(check(&Bytes, &pipelined(0), 100_000), Verdict::Linearizable);
        // A count kept that no order gives is caught as quickly.
        assert!(matches!(
            check(&Bytes, &pipelined(1), 100_000),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn the_budget_ends_the_search_with_no_verdict() {
        let h: Vec<_> = (0..40)
            .map(|i| op(true, i, None))
            .chain([op(false, 100, Some((101, 999)))])
            .collect();
        assert!(matches!(check(&Counter, &h, 50), Verdict::Unknown { .. }));
        assert_eq!(check(&Counter, &[], 1), Verdict::Linearizable);
    }
}
