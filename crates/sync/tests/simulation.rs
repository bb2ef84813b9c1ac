//! Deterministic simulation of one switch's worker syncing to a collector over a channel
//! that loses, duplicates, reorders and delays messages, on a virtual clock. At every step,
//! every location the collector calls bounded is within its bound of the data plane's
//! value as of the collector's last message; after the changes stop and the channel heals,
//! the collector holds every value exactly, and knows it (bound 0, whatever the
//! threshold: a period with no change carries `t_max` 0). Locations sent at every change
//! (a table's keys) are, when bounded, exactly the data plane's. Every message carries a MAC, and forged ones
//! (of another key) arrive among them and are refused. Each seed draws its own load (0.1x to 100x the
//! channel's capacity) and faults. `SYNC_SEEDS=100000 cargo test --release -p
//! stateplane-sync --test simulation` runs more seeds than the default 1,000.
//!
//! The same runs with takes cut short: the changes wait in the data plane, as a table's
//! marked slots do, and each step hands the sender only some of them (a location's changes
//! since it was last handed as one), its polls leaving the batch open until every change is
//! handed (`Sender::poll_open`).
#![allow(clippy::unwrap_used)]

use stateplane_gen::rng::Rng;
use stateplane_sync::Location;
use stateplane_sync::channel::{Channel, ChannelConfig, Faults};
use stateplane_sync::mirror::Mirror;
use stateplane_sync::rate::RateController;
use stateplane_sync::sender::{Sender, SenderConfig, SyncedState, Threshold};
use stateplane_sync::wire::{Key, Kind, Message};
use std::collections::{BTreeMap, HashMap};

const COUNTERS: u32 = 32;
const REGISTERS: u32 = 64;
/// Locations sent at every change whatever the threshold (a table's keys).
const KEYS: u32 = 16;
const STEP_NS: u64 = 50_000;
const CHANGES_END_NS: u64 = 100_000_000;
const HEAL_NS: u64 = 150_000_000;
const END_NS: u64 = 200_000_000;

fn locations() -> impl Iterator<Item = Location> {
    let counters = (0..COUNTERS).map(|index| Location { state: 0, index });
    let registers = (0..REGISTERS).map(|index| Location { state: 1, index });
    let keys = (0..KEYS).map(|index| Location { state: 2, index });
    counters.chain(registers).chain(keys)
}

/// What one seed's run saw.
#[derive(Debug, Default)]
struct Seen {
    checks: u64,
    bounded: u64,
    sent: u64,
    lost: u64,
    spoofed: u64,
    /// Polls that left their batch open, changes still waiting.
    left_open: u64,
}

/// Changes made but not handed to the sender yet, in the order first made, each with its
/// value before then: a table's marked slots, which a pass cut short leaves to the next.
#[derive(Default)]
struct Waiting {
    order: std::collections::VecDeque<Location>,
    before: HashMap<Location, u64>,
}

impl Waiting {
    fn add(&mut self, location: Location, old: u64) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.before.entry(location) {
            e.insert(old);
            self.order.push_back(location);
        }
    }
}

/// Hands the sender a change as the data plane reports it: a key's at once whatever the
/// threshold.
fn hand(sender: &mut Sender, now: u64, location: Location, old: u64, new: u64) {
    if location.state == 2 {
        sender.change_exact(location, old, new);
    } else {
        sender.change(now, location, old, new);
    }
}

/// A batch is left open at most this long; then the next step hands every change waiting.
const MAX_OPEN_NS: u64 = 5_000_000;

fn run(seed: u64, cut: bool) -> Seen {
    let repair = seed.is_multiple_of(2);
    let mut rng = Rng::new(seed);
    // Its own draws, so that a seed's load and faults are the same cut or not.
    let mut cutter = Rng::new(seed ^ 0xc075_5e17);
    let mut waiting = Waiting::default();
    let mut open_since: Option<u64> = None;
    // The channel carries 200 updates a second... to 20,000; the load is 0.1x to 100x that.
    let capacity = 200 * (1 + rng.below(100));
    let load_milli = [100, 1_000, 10_000, 100_000][rng.below(4) as usize];
    let changes_per_step = (capacity * load_milli / 1000 * STEP_NS).div_ceil(1_000_000_000);
    let faults = Faults {
        loss: rng.below(300) as f64 / 1000.0,
        duplicate: rng.below(100) as f64 / 1000.0,
        max_delay_ns: rng.below(3_000_000),
    };
    let mut channel = Channel::new(ChannelConfig {
        bytes_per_second: 0,
        buffer_bytes: 0,
        latency_ns: 1_000,
        faults,
        seed,
    });
    let slots = [4, 16, 64, 256][rng.below(4) as usize];
    // Mostly the rate controller; now and then a fixed threshold, 0 (every change) to 64.
    let threshold = match rng.below(5) {
        0 => Threshold::Fixed([0, 1, 2, 8, 64][rng.below(5) as usize]),
        _ => Threshold::Adaptive(RateController::new(capacity)),
    };
    let mut sender = Sender::new(SenderConfig {
        switch: 9,
        epoch: 1,
        stream: 0,
        slots,
        // Mostly the rate controller; now and then a fixed threshold, 0 (every change) to 64.
        threshold,
        max_age_ns: 10_000_000,
        heartbeat_ns: 2_000_000,
        batch_ns: [0, 100_000, 1_000_000][rng.below(3) as usize],
        refresh_ns: 20_000_000,
        states: vec![
            SyncedState::register(0, COUNTERS),
            SyncedState::register(1, REGISTERS),
            SyncedState::register(2, KEYS),
        ],
    });
    let mut mirror = Mirror::new(Some(vec![9]));
    let mut plane: HashMap<Location, u64> = locations().map(|l| (l, 0)).collect();
    // The data plane as each message in flight was sent, by sequence number.
    let mut snapshots: BTreeMap<u64, HashMap<Location, u64>> = BTreeMap::new();
    let mut arrived = Vec::new();
    let mut refused = 0;
    let mut seen = Seen::default();
    let mut out = Vec::new();
    let key = Key::new([seed as u8; 32]);
    let forger = Key::new([!(seed as u8); 32]);
    let mut now = 0;
    while now <= END_NS {
        if now < CHANGES_END_NS {
            for _ in 0..changes_per_step {
                if rng.chance(0.05) {
                    // A key: anywhere in 64 bits, or one off (as near a wrong key as
                    // can be), sent at once.
                    let l = Location {
                        state: 2,
                        index: rng.below(u64::from(KEYS)) as u32,
                    };
                    let new = if rng.chance(0.5) {
                        rng.next_u64()
                    } else {
                        plane[&l].wrapping_add(1)
                    };
                    let old = plane.insert(l, new).unwrap();
                    if cut {
                        waiting.add(l, old);
                    } else {
                        hand(&mut sender, now, l, old, new);
                    }
                    continue;
                }
                let (location, new) = if rng.chance(0.5) {
                    let l = Location {
                        state: 0,
                        index: rng.below(u64::from(COUNTERS)) as u32,
                    };
                    (l, plane[&l] + 1 + rng.below(3))
                } else {
                    let l = Location {
                        state: 1,
                        index: rng.below(u64::from(REGISTERS)) as u32,
                    };
                    // Registers go up and down, and now and then far.
                    let old = plane[&l];
                    let new = match rng.below(10) {
                        0 => rng.below(1 << 20),
                        1..5 => old.saturating_sub(rng.below(5)),
                        _ => old + rng.below(5),
                    };
                    (l, new)
                };
                let old = plane.insert(location, new).unwrap();
                if cut {
                    waiting.add(location, old);
                } else {
                    hand(&mut sender, now, location, old, new);
                }
            }
        }
        // Some of the changes waiting, or all of them once the batch has been open long.
        let take = match open_since {
            Some(since) if now - since >= MAX_OPEN_NS => usize::MAX,
            _ => 1 + cutter.below(changes_per_step.max(1) * 2) as usize,
        };
        for _ in 0..take {
            let Some(l) = waiting.order.pop_front() else {
                break;
            };
            let old = waiting.before.remove(&l).unwrap();
            hand(&mut sender, now, l, old, plane[&l]);
        }
        if now == HEAL_NS {
            channel.set_faults(Faults::default());
        }
        if waiting.order.is_empty() {
            open_since = None;
            sender.poll(now, |l| plane[&l], &mut out);
        } else {
            open_since.get_or_insert(now);
            sender.poll_open(now, &mut out);
            seen.left_open += 1;
        }
        for m in out.drain(..) {
            snapshots.insert(m.seq, plane.clone());
            let mut bytes = Vec::new();
            m.encode_with(Some(&key), &mut bytes);
            let _ = channel.send(now, bytes);
        }
        // The collector asks for the messages it lost (on even seeds; odd ones go
        // without, for comparison); the switch sends again those it kept, through the
        // same lossy channel. They were the data plane's as first sent: no new snapshot.
        if repair && let Some(nack) = mirror.nack(9, 0, now) {
            let mut again = Vec::new();
            sender.on_nack(&nack, &mut again);
            for m in again {
                let mut bytes = Vec::new();
                m.encode_with(Some(&key), &mut bytes);
                let _ = channel.send(now, bytes);
            }
        }
        channel.deliver(now, &mut arrived);
        // The collector's report, every 10 ms, back to the rate controller.
        if now % 10_000_000 == 0
            && let Some(report) = mirror.report(9, 0, now)
        {
            sender.on_report(now, &report);
        }
        // A forger who knows the format, not the key, claims a far-ahead message: taken,
        // it would end the stream's bounds.
        if rng.chance(0.02) {
            let forged = Message {
                kind: Kind::Updates,
                switch: 9,
                epoch: 1,
                stream: 0,
                seq: u64::MAX / 2,
                sent_ns: now,
                t_max: 0,
                more: false,
                entries: Vec::new(),
            };
            let mut bytes = Vec::new();
            forged.encode_with(Some(&forger), &mut bytes);
            arrived.push(bytes);
            seen.spoofed += 1;
        }
        for bytes in arrived.drain(..) {
            match Message::decode_with(Some(&key), &bytes) {
                Ok(m) => {
                    let _ = mirror.apply(&m);
                }
                Err(e) => {
                    assert_eq!(e.reason(), "bad_mac", "seed {seed}");
                    refused += 1;
                }
            }
        }
        if let Some(k) = mirror.last_seq(9, 0) {
            snapshots.retain(|&seq, _| seq >= k);
            let truth = &snapshots[&k];
            for l in locations() {
                let r = mirror.read(9, 0, l).unwrap();
                seen.checks += 1;
                if let Some(bound) = r.bound {
                    seen.bounded += 1;
                    let diverged = truth[&l].abs_diff(r.value);
                    // A key is sent at each change: bounded, it is the data plane's.
                    let bound = if l.state == 2 { 0 } else { bound };
                    assert!(
                        diverged <= bound,
                        "seed {seed}: {l:?} is {} as of message {k}, the collector holds {} \
                         within {bound}",
                        truth[&l],
                        r.value
                    );
                }
            }
        }
        now += STEP_NS;
    }
    assert_eq!(
        refused, seen.spoofed,
        "seed {seed}: every forged message, and only they"
    );
    seen.sent = channel.counters.sent;
    seen.lost = channel.counters.lost;
    for l in locations() {
        let r = mirror.read(9, 0, l).unwrap();
        assert_eq!(
            (r.value, r.bound),
            (plane[&l], Some(0)),
            "seed {seed}: {l:?} after the changes stopped and the channel healed"
        );
    }
    seen
}

/// Seeds to run: `SYNC_SEEDS`, or 1,000.
fn seeds() -> u64 {
    std::env::var("SYNC_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000)
}

/// The same runs, the changes waiting in the data plane and handed a few at a time.
#[test]
fn bounds_hold_when_takes_are_cut_short() {
    let seeds = seeds();
    let mut total = Seen::default();
    for seed in 0..seeds {
        let s = run(seed, true);
        total.checks += s.checks;
        total.bounded += s.bounded;
        total.lost += s.lost;
        total.left_open += s.left_open;
    }
    assert!(
        total.bounded * 4 > total.checks && total.lost > 0,
        "{total:?}"
    );
    assert!(total.left_open > seeds, "batches were left open: {total:?}");
    println!("{seeds} seeds, takes cut short: {total:?}");
}

#[test]
fn bounds_hold_at_every_step_and_the_mirror_converges() {
    let seeds = seeds();
    // Even seeds repair their losses, odd ones do not.
    let mut total = [Seen::default(), Seen::default()];
    for seed in 0..seeds {
        let s = run(seed, false);
        let t = &mut total[(seed % 2) as usize];
        t.checks += s.checks;
        t.bounded += s.bounded;
        t.sent += s.sent;
        t.lost += s.lost;
        t.spoofed += s.spoofed;
    }
    // The checks checked something: a good share of the readings were bounded (the rest
    // follow losses of up to 30% of the messages), and messages were lost.
    for t in &total {
        assert!(t.bounded * 4 > t.checks, "{total:?}");
        assert!(t.lost > 0 && t.sent > t.lost * 4, "{total:?}");
        assert!(t.spoofed > 0, "{total:?}");
    }
    let share = |t: &Seen| t.bounded as f64 / t.checks as f64;
    let (repaired, not) = (share(&total[0]), share(&total[1]));
    assert!(
        repaired > not,
        "asking for lost messages again bounds more readings: {repaired:.3} against {not:.3}"
    );
    println!(
        "{seeds} seeds: bounded {repaired:.3} of the readings with repair, {not:.3} without; \
         {total:?}"
    );
}
