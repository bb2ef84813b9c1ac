//! A progress bar that appears only when a run lasts more than a moment and stderr is a
//! terminal.

use indicatif::{ProgressBar, ProgressStyle};
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
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < Duration::from_millis(1500) {
                if !going_on(&stop, Duration::from_millis(50)) {
                    return;
                }
            }
            let bar = ProgressBar::new(total);
            // An input of unknown size (standard input) shows how far it has got, not how
            // far it has to go.
            let template = if total == 0 {
                if bytes {
                    "{elapsed_precise} {bytes} ({bytes_per_sec})"
                } else {
                    "{elapsed_precise} {human_pos} ({per_sec})"
                }
            } else if bytes {
                "{elapsed_precise} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})"
            } else {
                "{elapsed_precise} [{bar:40}] {human_pos}/{human_len} ({per_sec}, eta {eta})"
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            loop {
                bar.set_position(read());
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
}
