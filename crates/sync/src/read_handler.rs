//! A worker's read handler (the paper's Algorithm 1): a direct-mapped table of the
//! locations it has seen change, each with its value and the value last sent for it, so
//! that a change is sent only once the location's divergence reaches the threshold.
//!
//! Beyond the paper, each change arrives with the location's value before it. A location
//! leaves the table only by being sent (displaced by another, or too old), so what the
//! collector holds for it is exactly its value before its next change: the table takes
//! that as sent when the location comes back, where the paper assumed 0 (which lets a
//! register that went down after being displaced drift past the bound unseen).
//!
//! Invariant, for every location: `|value - last sent| <= divergence_bound(t)`, `t` the
//! threshold in force at its last change; none past a location's last `send`.

use crate::{Location, Update, divergence_bound};

/// No location: the word of an empty slot.
const EMPTY: u64 = u64::MAX;

#[derive(Clone, Copy, Debug)]
struct Slot {
    location: u64,
    value: u64,
    sent: u64,
    /// When the location came into the slot or was last sent.
    since_ns: u64,
}

impl Slot {
    /// Whether it holds a change not sent yet (what the timeout monitor looks for).
    fn waits(&self) -> bool {
        self.location != EMPTY && self.value != self.sent
    }
}

/// Keeps `unsent` (the slots that wait) as a slot went from waiting `was` to `now`.
#[inline]
fn settle(unsent: &mut usize, was: bool, now: bool) {
    match (was, now) {
        (false, true) => *unsent += 1,
        (true, false) => *unsent -= 1,
        _ => {}
    }
}

/// What a handler has done, for metrics and the rate controller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandlerCounters {
    pub changes: u64,
    /// Updates sent because a location's divergence reached the threshold.
    pub sent_divergent: u64,
    /// Updates sent because another location took the slot.
    pub sent_displaced: u64,
    /// Updates sent because a location waited longer than the timeout.
    pub sent_timed_out: u64,
    /// Updates sent at their change whatever the threshold ([`ReadHandler::change_exact`]:
    /// a table's key and action words, and the values top-down writes changed).
    pub sent_exact: u64,
}

impl HandlerCounters {
    /// Updates sent, for whatever reason.
    pub fn sent(&self) -> u64 {
        self.sent_divergent + self.sent_displaced + self.sent_timed_out + self.sent_exact
    }
}

pub struct ReadHandler {
    slots: Vec<Slot>,
    mask: usize,
    /// Where each state's locations start in the table, by state id (see `slot_of`).
    bases: Vec<usize>,
    threshold: u64,
    /// The total change since the rate controller last took it: the sum of `|new - old|`.
    change: u64,
    /// The timeout sweep's next slot.
    cursor: usize,
    /// Slots that wait (`Slot::waits`): the sweep has nothing to look for when none do, as
    /// on a switch whose state is quiet.
    unsent: usize,
    pub counters: HandlerCounters,
}

impl ReadHandler {
    /// The bytes a table of `slots` entries takes (so that a run can claim them first).
    pub fn bytes_for(slots: usize) -> u64 {
        (slots.max(1).next_power_of_two() * std::mem::size_of::<Slot>()) as u64
    }

    /// A table of `slots` entries (rounded up to a power of two; 2^16 is the paper's).
    pub fn new(slots: usize) -> ReadHandler {
        let slots = slots.max(1).next_power_of_two();
        ReadHandler {
            slots: vec![
                Slot {
                    location: EMPTY,
                    value: 0,
                    sent: 0,
                    since_ns: 0,
                };
                slots
            ],
            mask: slots - 1,
            bases: Vec::new(),
            threshold: 0,
            change: 0,
            cursor: 0,
            unsent: 0,
            counters: HandlerCounters::default(),
        }
    }

    /// Lays the synced state, `(id, length)` in order, out in the table one state after
    /// another, so that as many locations as it has slots never collide.
    pub fn with_states(mut self, states: &[(u16, u32)]) -> ReadHandler {
        let mut base = 0;
        for &(id, length) in states {
            let id = usize::from(id);
            if self.bases.len() <= id {
                self.bases.resize(id + 1, 0);
            }
            self.bases[id] = base;
            base += length as usize;
        }
        self
    }

    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Sets the threshold for the changes from now on.
    pub fn set_threshold(&mut self, t: u64) {
        self.threshold = t;
    }

    /// The total change since the last `take_change`, left in place.
    pub fn change_so_far(&self) -> u64 {
        self.change
    }

    /// The total change since the last call (the rate controller's Δ).
    pub fn take_change(&mut self) -> u64 {
        std::mem::take(&mut self.change)
    }

    /// Direct-mapped by the location's place in the synced state, as a processor's cache
    /// maps addresses: the changes of a pass come in index order, so the table is walked
    /// in order too, and a state's neighbours collide only one table's length apart.
    #[inline]
    fn slot_of(&self, location: Location) -> usize {
        let base = self.bases.get(usize::from(location.state)).copied();
        base.unwrap_or(0).wrapping_add(location.index as usize) & self.mask
    }

    /// Hints that `location`'s slot is about to be used: a pass's changes are far apart in
    /// a large state, each slot a cache miss, which a look ahead overlaps.
    #[inline]
    pub fn prefetch(&self, location: Location) {
        if let Some(slot) = self.slots.get(self.slot_of(location)) {
            stateplane_mem::prefetch(slot);
        }
    }

    /// `location` changed from `old` to `new` at `now_ns`; what must be sent goes to `out`.
    #[inline]
    pub fn change(
        &mut self,
        now_ns: u64,
        location: Location,
        old: u64,
        new: u64,
        out: &mut Vec<Update>,
    ) {
        let bound = divergence_bound(self.threshold);
        self.record(now_ns, location, (old, new), bound, out);
    }

    /// As [`change`](Self::change), for a location whose every change is sent at once
    /// whatever the threshold (a table's key or action): it costs the rate controller one
    /// update, not its divergence, and takes no slot of the table (nothing of it waits to
    /// be sent, so it must not displace a location whose changes do).
    #[inline]
    pub fn change_exact(&mut self, location: Location, old: u64, new: u64, out: &mut Vec<Update>) {
        self.counters.changes += 1;
        if old != new {
            self.change = self.change.saturating_add(1);
            out.push(Update {
                location,
                value: new,
                threshold: self.threshold,
            });
            self.counters.sent_exact += 1;
        }
    }

    /// A change, sent once the location is more than `bound` from what was last sent.
    #[inline]
    fn record(
        &mut self,
        now_ns: u64,
        location: Location,
        (old, new): (u64, u64),
        bound: u64,
        out: &mut Vec<Update>,
    ) {
        let word = location.packed();
        self.change = self.change.saturating_add(new.abs_diff(old));
        self.counters.changes += 1;
        let t = self.threshold;
        let p = self.slot_of(location);
        let slot = &mut self.slots[p];
        let was = slot.waits();
        if slot.location != word {
            if was {
                out.push(Update {
                    location: Location::unpacked(slot.location),
                    value: slot.value,
                    threshold: t,
                });
                self.counters.sent_displaced += 1;
            }
            // What the collector holds for a location out of the table: its value before
            // this change (see the module doc).
            *slot = Slot {
                location: word,
                value: old,
                sent: old,
                since_ns: now_ns,
            };
        }
        slot.value = new;
        if slot.value.abs_diff(slot.sent) > bound {
            out.push(Update {
                location,
                value: new,
                threshold: t,
            });
            slot.sent = new;
            slot.since_ns = now_ns;
            self.counters.sent_divergent += 1;
        }
        settle(&mut self.unsent, was, slot.waits());
    }

    /// Sends the locations among the next `visit` slots that have waited unsent for
    /// longer than `max_age_ns` (the timeout monitor), so that none stays divergent for
    /// long when nothing displaces it; at most `budget` of them (what the channel has room
    /// for), the sweep going on from the first slot it did not visit next time.
    pub fn expire(
        &mut self,
        now_ns: u64,
        max_age_ns: u64,
        visit: usize,
        mut budget: u64,
        out: &mut Vec<Update>,
    ) {
        for _ in 0..visit.min(self.slots.len()) {
            if budget == 0 || self.unsent == 0 {
                return;
            }
            let t = self.threshold;
            let slot = &mut self.slots[self.cursor];
            self.cursor = (self.cursor + 1) & self.mask;
            if slot.waits() && now_ns.saturating_sub(slot.since_ns) > max_age_ns {
                out.push(Update {
                    location: Location::unpacked(slot.location),
                    value: slot.value,
                    threshold: t,
                });
                slot.sent = slot.value;
                slot.since_ns = now_ns;
                self.unsent -= 1;
                self.counters.sent_timed_out += 1;
                budget -= 1;
            }
        }
    }

    /// `location` now holds `value` and the collector has it (a top-down write's change,
    /// sent as it came): what the slot holds and what it sent, so that neither the timeout
    /// monitor nor a displacement sends the value from before the write.
    pub fn written(&mut self, now_ns: u64, location: Location, value: u64) {
        self.update_holding(location, |slot| {
            slot.value = value;
            slot.sent = value;
            slot.since_ns = now_ns;
        });
    }

    /// `location` was sent with `value` outside the handler (the anti-entropy refresh,
    /// which reads the state itself): the table takes it as sent.
    pub fn sent_elsewhere(&mut self, now_ns: u64, location: Location, value: u64) {
        self.update_holding(location, |slot| {
            slot.sent = value;
            slot.since_ns = now_ns;
        });
    }

    /// Applies `update` to the slot `location` is in, if it holds it.
    fn update_holding(&mut self, location: Location, update: impl FnOnce(&mut Slot)) {
        let word = location.packed();
        let p = self.slot_of(location);
        let slot = &mut self.slots[p];
        if slot.location == word {
            let was = slot.waits();
            update(slot);
            settle(&mut self.unsent, was, slot.waits());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(index: u32) -> Location {
        Location { state: 0, index }
    }

    /// The paper's Figure 5 example, with its threshold of 4: updates go out when the
    /// divergence reaches 4, and a displaced entry goes out at once.
    #[test]
    fn divergence_and_displacement_send_as_the_paper_says() {
        let mut h = ReadHandler::new(1);
        h.set_threshold(4);
        let mut out = Vec::new();
        h.change(0, at(1), 0, 2, &mut out);
        assert!(out.is_empty(), "2 < 4");
        h.change(1, at(1), 2, 5, &mut out);
        assert_eq!(out.len(), 1, "5 - 0 >= 4");
        assert_eq!(out[0].value, 5);
        h.change(2, at(1), 5, 7, &mut out);
        assert_eq!(out.len(), 1, "7 - 5 < 4");
        h.change(3, at(2), 0, 1, &mut out);
        assert_eq!(out.len(), 2, "location 1 displaced with its value");
        assert_eq!((out[1].location, out[1].value), (at(1), 7));
        // Location 1 comes back: what the collector holds is its value before (7).
        h.change(4, at(1), 7, 9, &mut out);
        assert_eq!(out.len(), 3, "location 2 displaced (1 unsent); 9 - 7 < 4");
        assert_eq!((out[2].location, out[2].value), (at(2), 1));
    }

    /// An exact location goes out at its first change whatever the threshold, and costs the
    /// rate controller one update however far it moved.
    #[test]
    fn an_exact_location_is_sent_at_every_change_and_costs_one() {
        let mut h = ReadHandler::new(4);
        h.set_threshold(1_000);
        let mut out = Vec::new();
        h.change_exact(at(1), 0, 0xdead_beef, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].value, 0xdead_beef);
        h.change_exact(at(1), 0xdead_beef, 0xdead_bef0, &mut out);
        assert_eq!(out.len(), 2, "a key one off is a wrong key");
        h.change(2, at(2), 0, 999, &mut out);
        assert_eq!(out.len(), 2, "a counting location waits for its threshold");
        assert_eq!(h.take_change(), 2 + 999);
        // Locations 2 and 6 share a slot of the 4: an exact location takes none, so the
        // change waiting at 2 is not displaced by one at 6.
        h.change_exact(at(6), 0, 1, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(out[2].location, at(6));
        h.change(3, at(2), 999, 998, &mut out);
        assert_eq!(
            out.len(),
            3,
            "2 still held: 998 from the 0 sent is within the bound"
        );
        let c = h.counters;
        assert_eq!((c.sent_exact, c.sent_divergent, c.sent()), (3, 0, 3));
    }

    /// A register that goes down after it was displaced is still sent: the paper's reinsert
    /// with 0 as the value sent would see 3 - 0 < 4 and keep it, 97 from the collector's.
    #[test]
    fn a_location_back_in_the_table_diverges_from_what_was_sent() {
        let mut h = ReadHandler::new(1);
        h.set_threshold(4);
        let mut out = Vec::new();
        h.change(0, at(1), 0, 100, &mut out);
        h.change(1, at(2), 0, 1, &mut out);
        out.clear();
        h.change(2, at(1), 100, 3, &mut out);
        assert!(
            out.iter().any(|u| u.location == at(1) && u.value == 3),
            "{out:?}"
        );
    }

    #[test]
    fn threshold_zero_sends_every_change_and_nothing_unchanged() {
        let mut h = ReadHandler::new(16);
        let mut out = Vec::new();
        for v in 1..=10 {
            h.change(v, at(3), v - 1, v, &mut out);
        }
        h.change(11, at(3), 10, 10, &mut out);
        assert_eq!(out.len(), 10);
        assert_eq!(h.take_change(), 10);
        assert_eq!(h.take_change(), 0);
    }

    #[test]
    fn the_timeout_monitor_sends_what_waited_too_long() {
        let mut h = ReadHandler::new(8);
        h.set_threshold(100);
        let mut out = Vec::new();
        h.change(0, at(1), 0, 5, &mut out);
        h.expire(1_000, 1_000, 8, u64::MAX, &mut out);
        assert!(out.is_empty(), "not older than the timeout yet");
        h.expire(1_001, 1_000, 8, u64::MAX, &mut out);
        assert_eq!(out.len(), 1);
        h.expire(5_000, 1_000, 8, u64::MAX, &mut out);
        assert_eq!(out.len(), 1, "sent: nothing diverges any more");
        assert_eq!(h.counters.sent_timed_out, 1);
    }

    /// With room for only so many updates, the sweep sends that many and goes on from
    /// where it stopped next time, so every location still goes in turn.
    #[test]
    fn the_timeout_monitor_sends_no_more_than_its_budget_and_resumes() {
        let mut h = ReadHandler::new(8);
        h.set_threshold(100);
        let mut out = Vec::new();
        for i in 0..6 {
            h.change(0, at(i), 0, 5, &mut out);
        }
        h.expire(10, 1, 8, 4, &mut out);
        let first: Vec<u32> = out.iter().map(|u| u.location.index).collect();
        assert_eq!(first, [0, 1, 2, 3]);
        out.clear();
        h.expire(11, 1, 8, 4, &mut out);
        let next: Vec<u32> = out.iter().map(|u| u.location.index).collect();
        assert_eq!(next, [4, 5], "from where the budget stopped it");
        assert_eq!(h.counters.sent_timed_out, 6);
    }

    /// The states are laid out one after the other: as many locations as slots never
    /// displace one another; one past that does.
    #[test]
    fn states_laid_out_in_turn_fill_the_table_without_collisions() {
        let mut h = ReadHandler::new(8).with_states(&[(2, 5), (0, 3)]);
        h.set_threshold(1_000);
        let mut out = Vec::new();
        for (state, len) in [(2u16, 5u32), (0, 3)] {
            for index in 0..len {
                h.change(0, Location { state, index }, 0, 1, &mut out);
            }
        }
        assert!(out.is_empty(), "8 locations in 8 slots: {out:?}");
        h.change(1, Location { state: 2, index: 8 }, 0, 1, &mut out);
        assert_eq!(out.len(), 1, "state 2's index 8 takes index 0's slot");
        assert_eq!(out[0].location, Location { state: 2, index: 0 });
    }

    /// The count of waiting slots, which lets the sweep stop when there are none, is the
    /// count of slots that wait after any mix of changes, displacements, sends, writes and
    /// refreshes; and a sweep with none waiting sends nothing, as one that looked would.
    #[test]
    fn the_slots_that_wait_are_counted_through_every_kind_of_change() {
        let mut h = ReadHandler::new(8);
        h.set_threshold(3);
        let mut out = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for step in 0..20_000u64 {
            let location = at(next(32) as u32);
            let value = next(10);
            match next(6) {
                0 | 1 => h.change(step, location, next(10), value, &mut out),
                2 => h.change_exact(location, 0, value, &mut out),
                3 => h.written(step, location, value),
                4 => h.sent_elsewhere(step, location, value),
                _ => h.expire(step, next(4), next(9) as usize, next(3), &mut out),
            }
            let waiting = h.slots.iter().filter(|s| s.waits()).count();
            assert_eq!(h.unsent, waiting, "step {step}");
        }
        h.expire(u64::MAX, 0, 8, u64::MAX, &mut out);
        assert_eq!(h.unsent, 0, "a whole sweep past every age sends every wait");
        let sent = out.len();
        h.expire(u64::MAX, 0, 8, u64::MAX, &mut out);
        assert_eq!(out.len(), sent, "nothing waits: nothing sent");
    }
}
