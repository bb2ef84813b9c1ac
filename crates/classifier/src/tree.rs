//! A decision tree over one table's rules: each inner node tests one bit of the packet's
//! fields, each leaf holds the few rules that can match there, best ranked first. A
//! lookup walks one path and scans one leaf, however many masks the rules have, where
//! tuple search probes a tuple for each (HyperCuts and HyperSplit cut on ranges; a bit
//! serves the ternary masks of every field alike).
//!
//! The tree changes in place, rule by rule: an insert goes down every branch its mask
//! leaves open and joins the leaves it reaches, a leaf grown past [`LEAF_RULES`] splits on
//! the bit that parts its rules best, a remove takes the rule from the same leaves. No
//! update rebuilds the tree, so none stalls the worker. A rule open on many bits is in
//! many leaves, as a 4-byte slot of the one entry that holds it; past [`BYTES_A_RULE`] a
//! rule on average the tree gives up (the table then searches its tuples alone).
//!
//! Must never: give a lookup any rule but the best ranked that matches; allocate on a
//! lookup.

use crate::fields::Fields;
use crate::rule::Pattern;
use crate::ruleset::Rank;

/// A leaf splits when it holds more rules than this (and a bit parts them).
const LEAF_RULES: usize = 8;

/// Levels at most: a leaf this deep does not split.
const MAX_DEPTH: usize = 40;

/// Bytes the tree may hold a rule, on average, before it gives up: its entry and about
/// two hundred places in leaves (ClassBench-like ACLs take five). The rules' memory budget
/// counts them (`stateplane_programs::pipeline::Pipeline::bytes_for_rules`).
pub const BYTES_A_RULE: usize = 1024;

/// A rule as a leaf checks it: its masks and values as the packet's words
/// ([`Fields::words`], ports left out: they match by range).
#[derive(Debug, Clone)]
struct Entry {
    rank: Rank,
    mask: [u64; 7],
    value: [u64; 7],
    tp_src: (u16, u16),
    tp_dst: (u16, u16),
}

/// The bits of the last word that hold the ports.
const PORT_BITS: u64 = 0xffff_ffff;

impl Entry {
    fn of(rank: Rank, pattern: &Pattern) -> Entry {
        let (mut mask, mut value) = (pattern.mask.words(), pattern.value.words());
        mask[6] &= !PORT_BITS;
        value[6] &= mask[6];
        Entry {
            rank,
            mask,
            value,
            tp_src: pattern.tp_src,
            tp_dst: pattern.tp_dst,
        }
    }

    #[inline]
    fn matches(&self, words: &[u64; 7], f: &Fields) -> bool {
        let differ = (words.iter().zip(&self.mask).zip(&self.value))
            .fold(0, |d, ((w, m), v)| d | ((w & m) ^ v));
        differ == 0
            && (self.tp_src.0..=self.tp_src.1).contains(&f.tp_src)
            && (self.tp_dst.0..=self.tp_dst.1).contains(&f.tp_dst)
    }

    /// Which way a rule goes at a node testing `bit` of `word`: one side, or both when
    /// its mask leaves the bit open.
    fn sides(&self, word: usize, bit: u32) -> (bool, bool) {
        match (self.mask[word] >> bit & 1, self.value[word] >> bit & 1) {
            (0, _) => (true, true),
            (_, 0) => (true, false),
            _ => (false, true),
        }
    }
}

#[derive(Debug, Clone)]
enum Node {
    /// Tests `bit` of the packet's `word`: `next[0]` where it is 0, `next[1]` where 1.
    Split { word: u8, bit: u8, next: [u32; 2] },
    /// The slots of the rules that may match here, in rank order, and the size at which
    /// to try a split again (one tried and found no bit: each try reads every bit of
    /// every rule here, too much for each insert into a leaf no bit parts).
    Leaf(Vec<u32>, usize),
}

/// The tree. Invariant: every rule of the table has one entry, whose slot is in each leaf
/// its mask reaches from the root (both ways at a node whose bit it leaves open), in rank
/// order; nowhere else.
#[derive(Debug, Clone)]
pub(crate) struct Tree {
    nodes: Vec<Node>,
    /// The rules' entries by slot; a free slot's entry is stale until reused.
    entries: Vec<Entry>,
    free: Vec<u32>,
    /// Bytes the leaves' slots hold (their capacity), and rules.
    leaf_bytes: usize,
    rules: usize,
}

impl Default for Tree {
    fn default() -> Tree {
        Tree {
            nodes: vec![Node::Leaf(Vec::new(), LEAF_RULES + 1)],
            entries: Vec::new(),
            free: Vec::new(),
            leaf_bytes: 0,
            rules: 0,
        }
    }
}

const SLOT_BYTES: usize = std::mem::size_of::<u32>();

/// What a tree looks like: its leaves, their depth (mean and most), the rules a leaf
/// holds (mean and most), and the leaves a rule is in on average.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TreeShape {
    pub leaves: usize,
    pub mean_depth: f64,
    pub max_depth: usize,
    pub mean_leaf: f64,
    pub max_leaf: usize,
    pub leaves_a_rule: f64,
}

impl std::fmt::Display for TreeShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} leaves at depth {:.1} ({} at most) of {:.1} rules ({} at most), a rule in {:.1}",
            self.leaves,
            self.mean_depth,
            self.max_depth,
            self.mean_leaf,
            self.max_leaf,
            self.leaves_a_rule
        )
    }
}

impl Tree {
    /// The best ranked rule matching `f`.
    #[inline]
    pub fn lookup(&self, f: &Fields) -> Option<Rank> {
        let words = f.words();
        let mut at = 0;
        loop {
            match &self.nodes[at] {
                Node::Split { word, bit, next } => {
                    at = next[(words[*word as usize] >> bit & 1) as usize] as usize;
                }
                Node::Leaf(slots, _) => {
                    return (slots.iter())
                        .map(|&s| &self.entries[s as usize])
                        .find(|e| e.matches(&words, f))
                        .map(|e| e.rank);
                }
            }
        }
    }

    pub fn shape(&self) -> TreeShape {
        let (mut leaves, mut depths, mut max_depth, mut places, mut max_leaf) = (0, 0, 0, 0, 0);
        let mut stack = vec![(0usize, 0usize)];
        while let Some((at, depth)) = stack.pop() {
            match &self.nodes[at] {
                Node::Split { next, .. } => {
                    stack.extend(next.iter().map(|&n| (n as usize, depth + 1)));
                }
                Node::Leaf(slots, _) => {
                    (leaves, depths, places) = (leaves + 1, depths + depth, places + slots.len());
                    (max_depth, max_leaf) = (max_depth.max(depth), max_leaf.max(slots.len()));
                }
            }
        }
        TreeShape {
            leaves,
            mean_depth: depths as f64 / leaves as f64,
            max_depth,
            mean_leaf: places as f64 / leaves as f64,
            max_leaf,
            leaves_a_rule: places as f64 / self.rules.max(1) as f64,
        }
    }

    /// Bytes the tree holds.
    pub fn bytes(&self) -> usize {
        self.leaf_bytes
            + self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.free.capacity() * SLOT_BYTES
    }

    /// Whether the rules are copied so often that the tree should go: more than
    /// [`BYTES_A_RULE`] a rule on average.
    pub fn too_large(&self) -> bool {
        self.bytes() > BYTES_A_RULE * self.rules.max(1)
    }

    pub fn insert(&mut self, rank: Rank, pattern: &Pattern) {
        self.rules += 1;
        let entry = Entry::of(rank, pattern);
        let slot = match self.free.pop() {
            Some(slot) => {
                self.entries[slot as usize] = entry;
                slot
            }
            None => {
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        };
        let mut stack = vec![(0usize, 0usize)];
        while let Some((at, depth)) = stack.pop() {
            let Tree { nodes, entries, .. } = self;
            let entry = &entries[slot as usize];
            match &mut nodes[at] {
                Node::Split { word, bit, next } => {
                    let (zero, one) = entry.sides(*word as usize, u32::from(*bit));
                    if zero {
                        stack.push((next[0] as usize, depth + 1));
                    }
                    if one {
                        stack.push((next[1] as usize, depth + 1));
                    }
                }
                Node::Leaf(slots, try_at) => {
                    let place = slots.partition_point(|&s| entries[s as usize].rank < rank);
                    let before = slots.capacity();
                    slots.insert(place, slot);
                    self.leaf_bytes += (slots.capacity() - before) * SLOT_BYTES;
                    if slots.len() >= *try_at && depth < MAX_DEPTH {
                        self.split(at, depth);
                    }
                }
            }
        }
    }

    pub fn remove(&mut self, rank: Rank, pattern: &Pattern) {
        let entry = Entry::of(rank, pattern);
        let mut stack = vec![0usize];
        let mut freed = None;
        while let Some(at) = stack.pop() {
            let Tree { nodes, entries, .. } = self;
            match &mut nodes[at] {
                Node::Split { word, bit, next } => {
                    let (zero, one) = entry.sides(*word as usize, u32::from(*bit));
                    if zero {
                        stack.push(next[0] as usize);
                    }
                    if one {
                        stack.push(next[1] as usize);
                    }
                }
                Node::Leaf(slots, _) => {
                    if let Some(i) = slots.iter().position(|&s| entries[s as usize].rank == rank) {
                        freed = Some(slots.remove(i));
                    }
                    // A leaf emptied by removes gives its memory back.
                    if slots.len() * 4 <= slots.capacity() {
                        let before = slots.capacity();
                        slots.shrink_to(slots.len() * 2);
                        self.leaf_bytes -= (before - slots.capacity()) * SLOT_BYTES;
                    }
                }
            }
        }
        if let Some(slot) = freed {
            self.free.push(slot);
            self.rules -= 1;
        }
    }

    /// Splits the leaf at `at` on the bit that parts its rules best, and its halves in
    /// turn while they are still too full and a bit parts them.
    fn split(&mut self, at: usize, depth: usize) {
        let Node::Leaf(slots, _) = &self.nodes[at] else {
            return;
        };
        let held: Vec<&Entry> = slots.iter().map(|&s| &self.entries[s as usize]).collect();
        let Some((word, bit)) = best_bit(&held) else {
            if let Node::Leaf(slots, try_at) = &mut self.nodes[at] {
                *try_at = slots.len() + slots.len() / 2;
            }
            return;
        };
        let placeholder = Node::Leaf(Vec::new(), 0);
        let Node::Leaf(slots, _) = std::mem::replace(&mut self.nodes[at], placeholder) else {
            return;
        };
        self.leaf_bytes -= slots.capacity() * SLOT_BYTES;
        let (mut zero, mut one) = (Vec::new(), Vec::new());
        for s in slots {
            let (z, o) = self.entries[s as usize].sides(word, bit);
            if z {
                zero.push(s);
            }
            if o {
                one.push(s);
            }
        }
        self.leaf_bytes += (zero.capacity() + one.capacity()) * SLOT_BYTES;
        let first = self.nodes.len();
        let (z, o) = (zero.len(), one.len());
        self.nodes.push(Node::Leaf(zero, LEAF_RULES + 1));
        self.nodes.push(Node::Leaf(one, LEAF_RULES + 1));
        self.nodes[at] = Node::Split {
            word: word as u8,
            bit: bit as u8,
            next: [first as u32, first as u32 + 1],
        };
        for (child, len) in [(first, z), (first + 1, o)] {
            if len > LEAF_RULES && depth + 1 < MAX_DEPTH {
                self.split(child, depth + 1);
            }
        }
    }
}

/// The bit that parts `entries` best: the fewest rules on the fuller side, then the
/// fewest copies; none if no bit leaves both sides smaller than the whole, or copies
/// would grow by more than half.
fn best_bit(entries: &[&Entry]) -> Option<(usize, u32)> {
    let n = entries.len();
    let mut best: Option<((usize, usize), (usize, u32))> = None;
    for word in 0..7 {
        let open = entries.iter().fold(0, |m, e| m | e.mask[word]);
        let mut bits = open;
        while bits != 0 {
            let bit = bits.trailing_zeros();
            bits &= bits - 1;
            let (mut zero, mut one) = (0, 0);
            for e in entries {
                let (z, o) = e.sides(word, bit);
                zero += usize::from(z);
                one += usize::from(o);
            }
            let score = (zero.max(one), zero + one);
            let parts = score.0 < n && 2 * score.1 <= 3 * n;
            if parts && best.is_none_or(|(b, _)| score < b) {
                best = Some((score, (word, bit)));
            }
        }
    }
    best.map(|(_, at)| at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ruleset::RuleId;

    /// An empty tree is one leaf; rules that each fix a different address split it without
    /// a copy, and a rule open on every bit joins every leaf.
    #[test]
    fn a_trees_shape_counts_its_leaves_depths_and_copies() {
        let mut t = Tree::default();
        let empty = t.shape();
        assert_eq!((empty.leaves, empty.max_depth, empty.max_leaf), (1, 0, 0));
        let rank = |n: u32| Rank {
            priority: std::cmp::Reverse(1),
            seq: u64::from(n),
            id: RuleId(n),
        };
        for n in 0..32u32 {
            let mut p = Pattern::ANY;
            p.mask.ip_dst = u128::MAX;
            p.value.ip_dst = u128::from(n);
            t.insert(rank(n), &p);
        }
        let split = t.shape();
        assert!(split.leaves >= 4 && split.max_leaf <= LEAF_RULES, "{split}");
        assert_eq!(split.leaves_a_rule, 1.0, "{split}");
        t.insert(rank(99), &Pattern::ANY);
        let open = t.shape();
        // Each fixed rule in one leaf, the open one in all (which may have split again).
        assert!(open.leaves >= split.leaves);
        assert_eq!(
            open.leaves_a_rule,
            (32 + open.leaves) as f64 / 33.0,
            "{open}"
        );
    }
}
