//! A progress bar that appears only when a run lasts more than a moment and stderr is a
//! terminal.

use indicatif::{ProgressBar, ProgressStyle};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Watches a value through `read` and draws it against `total` until dropped.
pub struct Progress {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// `total` in the unit `read` returns (0: unknown); `bytes` says whether that is bytes.
    pub fn start(total: u64, bytes: bool, read: impl Fn() -> u64 + Send + 'static) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < Duration::from_millis(1500) {
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
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
            while !flag.load(Ordering::Relaxed) {
                bar.set_position(read());
                std::thread::sleep(Duration::from_millis(100));
            }
            bar.finish_and_clear();
        });
        Progress {
            done,
            thread: Some(thread),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
