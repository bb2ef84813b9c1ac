//! Deterministic simulation of top-down writes on a virtual clock, over a channel that
//! loses (up to 80% each way), duplicates and reorders: the collector's engine resets a
//! switch's counters (keeping what was counted since each reset's part arrived) and sets
//! its registers, one write after another, while the data plane counts. At every step the
//! registers are all of one write (none is ever seen half applied); every write commits
//! once, in order; and no count is lost: what was counted equals what the counters hold
//! plus what the resets replaced. Now and then the collector cancels the write on its way:
//! a write the switch says it dropped never commits, one it had committed is reported
//! committed, and the writes after it still commit. `SYNC_SEEDS=N` runs N seeds (1,000 by
//! default).
#![allow(clippy::unwrap_used)]

use stateplane_gen::rng::Rng;
use stateplane_sync::Location;
use stateplane_sync::channel::{Channel, ChannelConfig, Faults, WriteLink};
use stateplane_sync::write::{Cancel, Mode, WriteEngine, WriteStage, WriteTarget, Written};
use std::collections::BTreeSet;

const COUNTERS: u32 = 200;
const REGISTERS: u32 = 100;
const STEP_NS: u64 = 20_000;
const WRITES: u64 = 12;

fn channel(seed: u64, faults: Faults) -> Channel {
    Channel::new(ChannelConfig {
        bytes_per_second: 100_000_000,
        buffer_bytes: 1 << 20,
        latency_ns: 20_000,
        faults,
        seed,
    })
}

/// The switch's synced state: counters (state 0) and registers (state 1).
struct Switch {
    counters: Vec<u64>,
    registers: Vec<u64>,
}

impl WriteTarget for Switch {
    fn read(&self, l: Location) -> u64 {
        match l.state {
            0 => self.counters[l.index as usize],
            _ => self.registers[l.index as usize],
        }
    }
    fn write(&mut self, l: Location, v: u64) {
        match l.state {
            0 => self.counters[l.index as usize] = v,
            _ => self.registers[l.index as usize] = v,
        }
    }
}

/// Parts sent, writes the switch dropped when asked, writes asked too late.
fn run(seed: u64) -> (u64, u64, u64) {
    let mut rng = Rng::new(seed);
    let faults = Faults {
        loss: rng.below(81) as f64 / 100.0,
        duplicate: rng.below(20) as f64 / 100.0,
        max_delay_ns: rng.below(500_000),
    };
    let mut link = WriteLink::new(channel(seed, faults), channel(seed ^ 1, faults));
    let mut engine = WriteEngine::new(3, 1, 0, 200_000);
    let mut stage = WriteStage::default();
    let mut sw = Switch {
        counters: vec![0; COUNTERS as usize],
        registers: vec![0; REGISTERS as usize],
    };
    let (mut counted, mut replaced) = (0u64, 0u64);
    let (mut submitted, mut last_committed, mut completed) = (0u64, 0u64, 0u64);
    let (mut committed, mut cancelled) = (BTreeSet::new(), BTreeSet::new());
    let mut asked = BTreeSet::new();
    let mut transmissions = 0;
    let mut now = 0u64;
    while completed < WRITES {
        assert!(
            now < 60_000_000_000,
            "seed {seed}: writes still not through"
        );
        if submitted < WRITES && engine.is_idle() && rng.chance(0.05) {
            submitted += 1;
            // Locations in reverse order make no runs, so that a write is several parts.
            let resets = (0..COUNTERS).rev().map(|index| Written {
                location: Location { state: 0, index },
                value: 0,
                mode: Mode::SetKeepingChanges,
            });
            let sets = (0..REGISTERS).rev().map(|index| Written {
                location: Location { state: 1, index },
                value: submitted * 1_000 + u64::from(index),
                mode: Mode::Set,
            });
            assert_eq!(
                engine.submit(resets.chain(sets).collect::<Vec<_>>()),
                Ok(submitted)
            );
        }
        // The data plane counts.
        for _ in 0..rng.below(20) {
            sw.counters[rng.below(u64::from(COUNTERS)) as usize] += 1;
            counted += 1;
        }
        // Between bursts, the switch commits what is whole.
        if let Some(c) = stage.commit(&mut sw) {
            assert!(c.id > last_committed, "seed {seed}: in order, once");
            last_committed = c.id;
            committed.insert(c.id);
            replaced += c.replaced;
        }
        if !engine.is_idle() && rng.chance(0.0005) {
            let cancel = engine.cancel(submitted);
            assert_eq!(
                cancel,
                Cancel::Asked,
                "seed {seed}: write {submitted} is on its way"
            );
            asked.insert(submitted);
        }
        let write = (sw.registers[0] / 1_000) as usize;
        for (i, &r) in sw.registers.iter().enumerate() {
            let whole = if write == 0 {
                r == 0
            } else {
                r == (write * 1_000 + i) as u64
            };
            assert!(
                whole,
                "seed {seed}: register {i} is {r}, not of write {write}"
            );
        }
        if let Some(done) = link.step(now, &mut engine, &mut stage, &mut sw).unwrap() {
            completed += 1;
            assert_eq!(done.id, completed, "seed {seed}");
            transmissions += done.transmissions;
            if done.cancelled {
                cancelled.insert(done.id);
            }
        }
        now += STEP_NS;
    }
    // A write whole at the switch when its cancel came was answered as committed: it
    // commits between the next two bursts.
    if let Some(c) = stage.commit(&mut sw) {
        committed.insert(c.id);
        replaced += c.replaced;
    }
    assert!(
        committed.is_disjoint(&cancelled),
        "seed {seed}: a write the switch dropped committed: {committed:?} {cancelled:?}"
    );
    assert_eq!(
        committed.len() + cancelled.len(),
        WRITES as usize,
        "seed {seed}: every write committed or dropped (acknowledged before committed?): {committed:?} {cancelled:?}"
    );
    assert_eq!(
        counted,
        sw.counters.iter().sum::<u64>() + replaced,
        "seed {seed}: a count lost to a reset"
    );
    let too_late = asked.difference(&cancelled).count() as u64;
    (transmissions, cancelled.len() as u64, too_late)
}

#[test]
fn writes_commit_whole_once_in_order_and_lose_no_count() {
    let seeds: u64 = std::env::var("SYNC_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000);
    let (mut transmissions, mut dropped, mut too_late) = (0, 0, 0);
    for seed in 0..seeds {
        let (sent, d, late) = run(seed);
        transmissions += sent;
        dropped += d;
        too_late += late;
    }
    println!(
        "{seeds} seeds, {transmissions} parts sent, {dropped} writes dropped when cancelled, \
         {too_late} cancelled too late (committed)"
    );
    assert!(dropped > 0 && too_late > 0, "{dropped} {too_late}");
    // Five parts a write (200 + 100 values, runs of one of 21 and 22 bytes, 66 to a
    // part), twelve writes a seed: more went than that.
    assert!(transmissions > seeds * WRITES * 6, "{transmissions}");
}
