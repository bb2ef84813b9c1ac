//! The rate controller: every window it reads the total change `Δ` and sets the threshold
//! for the next one, 0 (send every change) while `Δ / w <= M`, else `ceil(β Δ / (w M))`,
//! so that the updates sent, about `Δ / t` a window, stay within the channel's `M` a second.

/// Sets the threshold from the total change of each window.
#[derive(Clone, Copy, Debug)]
pub struct RateController {
    pub window_ns: u64,
    /// The updates a second the channel carries (`M`): its capacity over an update's size.
    pub capacity: u64,
    /// Headroom for bursts (`β >= 1`), in thousandths: 1,000 is the paper's `β = 1`.
    pub beta_milli: u64,
}

impl RateController {
    /// The paper's defaults: a window of 1 ms and `β = 1`.
    pub fn new(capacity: u64) -> RateController {
        RateController {
            window_ns: 1_000_000,
            capacity: capacity.max(1),
            beta_milli: 1_000,
        }
    }

    /// `M` from a channel of `bytes_per_second` and updates of `update_bytes` each.
    pub fn capacity_of(bytes_per_second: u64, update_bytes: u64) -> u64 {
        (bytes_per_second / update_bytes.max(1)).max(1)
    }

    /// The threshold for the next window, after a window whose total change was `change`.
    pub fn threshold(&self, change: u64) -> u64 {
        self.threshold_over(change, self.window_ns)
    }

    /// The updates the channel carries in `ns` (at least 1).
    pub fn carried_in(&self, ns: u64) -> u64 {
        let n = u128::from(self.capacity) * u128::from(ns) / 1_000_000_000;
        u64::try_from(n).unwrap_or(u64::MAX).max(1)
    }

    /// The threshold after a window of `window_ns` (a worker busy with a burst may end a
    /// window late) whose total change was `change`: the same rate of change as
    /// [`RateController::threshold`] gives the same threshold over any window.
    pub fn threshold_over(&self, change: u64, window_ns: u64) -> u64 {
        // What the channel carries in the window: M w.
        let per_window = u128::from(self.carried_in(window_ns));
        let change = u128::from(change);
        if change <= per_window {
            return 0;
        }
        let t = (u128::from(self.beta_milli) * change).div_ceil(1_000 * per_window);
        u64::try_from(t).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper's example: 10 Gb/s of 16-byte updates, a window of 1 ms; 10^4 changes in
    /// a window send every change, 10^6 need a threshold of 13.
    #[test]
    fn the_papers_example() {
        let m = RateController::capacity_of(10_000_000_000 / 8, 16);
        assert_eq!(m, 78_125_000);
        let c = RateController::new(m);
        assert_eq!(c.threshold(10_000), 0);
        assert_eq!(c.threshold(78_125), 0, "exactly the capacity");
        assert_eq!(c.threshold(78_126), 2);
        assert_eq!(c.threshold(1_000_000), 13);
        assert_eq!(c.threshold(u64::MAX), u64::MAX.div_ceil(78_125));
    }

    #[test]
    fn beta_adds_headroom_and_a_tiny_capacity_still_sets_a_threshold() {
        let c = RateController {
            beta_milli: 1_500,
            ..RateController::new(1_000_000)
        };
        assert_eq!(c.threshold(2_000), 3, "ceil(1.5 * 2000 / 1000)");
        let tiny = RateController::new(1);
        assert_eq!(tiny.threshold(1), 0);
        assert_eq!(tiny.threshold(5), 5);
    }

    #[test]
    fn a_longer_window_with_as_much_change_per_millisecond_gives_the_same_threshold() {
        let c = RateController::new(1_000_000);
        assert_eq!(c.carried_in(1_000_000), 1_000);
        assert_eq!(c.threshold(5_000), 5);
        assert_eq!(c.threshold_over(12_500, 2_500_000), 5);
        assert_eq!(c.threshold_over(2_500, 2_500_000), 0);
    }
}
