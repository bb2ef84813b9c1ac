//! A progress bar that appears only when a run lasts more than a moment and stderr is a
//! terminal.

use indicatif::{HumanBytes, HumanCount, HumanDuration, ProgressBar, ProgressStyle};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Watches a value through `read` and draws it against `total` until dropped.
pub struct Progress {
    /// Dropped to stop the thread: it wakes at once, not at its next tick (a sleeping
    /// thread held the end of every short run back by up to 50 ms, 25 ms on average).
    done: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Waits `tick`; whether the progress is to go on (false once the sender is dropped).
fn going_on(done: &Receiver<()>, tick: Duration) -> bool {
    matches!(done.recv_timeout(tick), Err(RecvTimeoutError::Timeout))
}

impl Progress {
    /// `total` in the unit `read` returns (0: unknown); `bytes` says whether that is bytes.
    pub fn start(total: u64, bytes: bool, read: impl Fn() -> u64 + Send + 'static) -> Self {
        let (done, stop) = channel();
        let start = Instant::now();
        let thread = std::thread::spawn(move || {
            while start.elapsed() < APPEARS_AFTER {
                if !going_on(&stop, Duration::from_millis(50)) {
                    return;
                }
            }
            let bar = ProgressBar::new(total).with_elapsed(start.elapsed());
            // The rate and the time left are ours (see `status`), not indicatif's: its
            // rate, estimated from the bar's first steps, read the jump from 0 to what a
            // second had read as tens of TiB/s, with four decimals.
            let template = if total == 0 {
                "{elapsed_precise} {msg}"
            } else {
                "{elapsed_precise} [{bar:40}] {msg}"
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            loop {
                let done = read();
                bar.set_position(done);
                bar.set_message(status(done, total, start.elapsed(), bytes));
                if !going_on(&stop, Duration::from_millis(100)) {
                    break;
                }
            }
            bar.finish_and_clear();
        });
        Progress {
            done: Some(done),
            thread: Some(thread),
        }
    }
}

/// How long a run goes before its bar is drawn: a run shorter than that has no bar.
const APPEARS_AFTER: Duration = Duration::from_secs(1);

/// What the bar says beside itself: how far the run has got (of `total`, when known), its
/// mean rate since it started and the time left at that rate. The mean over the whole run,
/// not a recent window, because reading a file goes at an even pace and a mean cannot
/// spike; a rate is shown with at most two decimals.
fn status(done: u64, total: u64, elapsed: Duration, bytes: bool) -> String {
    let amount = |n: f64| {
        if bytes {
            HumanBytes(n as u64).to_string()
        } else {
            HumanCount(n as u64).to_string()
        }
    };
    let unit = if bytes { "" } else { " packets" };
    let seconds = elapsed.as_secs_f64();
    let rate = if seconds > 0.0 {
        done as f64 / seconds
    } else {
        0.0
    };
    let rate_text = if rate > 0.0 {
        format!("{}/s", amount(rate))
    } else {
        "starting".to_string()
    };
    if total == 0 {
        return format!("{}{unit} ({rate_text})", amount(done as f64));
    }
    let left = match total.saturating_sub(done) {
        0 => "eta 0s".to_string(),
        _ if rate <= 0.0 => "eta unknown".to_string(),
        rest => format!(
            "eta {}",
            HumanDuration(Duration::from_secs_f64((rest as f64 / rate).min(1e9)))
        ),
    };
    format!(
        "{} of {}{unit} ({rate_text}, {left})",
        amount(done as f64),
        amount(total as f64)
    )
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The thread ticks while the progress lives and stops as soon as it is dropped, not
    /// at the end of its tick (an hour here: a stop that waited would hang the test). A
    /// `Progress` whose drop did not let its thread go would hang the last line.
    #[test]
    fn stops_at_once_when_dropped() {
        let (done, stop) = channel();
        assert!(going_on(&stop, Duration::from_millis(1)));
        drop(done);
        assert!(!going_on(&stop, Duration::from_secs(3600)));
        let progress = Progress::start(10, false, || 0);
        drop(progress);
    }

    /// From its first second, the bar reads a rate that is the run's own (a second that
    /// read 500 MiB reads 500 MiB/s, not tens of TiB/s), with at most two decimals, and
    /// the time left at that rate.
    #[test]
    fn says_a_sane_rate_and_the_time_left_from_the_first_second() {
        const MIB: u64 = 1 << 20;
        let s = status(500 * MIB, 3000 * MIB, Duration::from_secs(1), true);
        assert_eq!(s, "500.00 MiB of 2.93 GiB (500.00 MiB/s, eta 5 seconds)");
        let s = status(1_500_000, 10_000_000, Duration::from_millis(1500), false);
        assert_eq!(
            s,
            "1,500,000 of 10,000,000 packets (1,000,000/s, eta 9 seconds)"
        );
    }

    /// The edges: nothing read yet, all read, a total not known (standard input), a
    /// clock that has not moved.
    #[test]
    fn says_so_when_the_rate_or_the_end_is_not_known() {
        let one = Duration::from_secs(1);
        assert_eq!(
            status(0, 100, one, true),
            "0 B of 100 B (starting, eta unknown)"
        );
        assert_eq!(
            status(100, 100, one, true),
            "100 B of 100 B (100 B/s, eta 0s)"
        );
        assert_eq!(status(2048, 0, one, true), "2.00 KiB (2.00 KiB/s)");
        assert_eq!(
            status(5, 10, Duration::ZERO, false),
            "5 of 10 packets (starting, eta unknown)"
        );
        // Past the end (a file that grew as it was read): no negative time left.
        assert_eq!(
            status(200, 100, one, true),
            "200 B of 100 B (200 B/s, eta 0s)"
        );
    }
}
