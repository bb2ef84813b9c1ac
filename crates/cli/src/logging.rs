//! Log lines on stderr with a UTC timestamp and a level, filtered by `--log-level` or the
//! `STATEPLANE_LOG` environment variable (error, warn, info, debug, trace; default info).

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

struct StderrLogger;

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            Level::Error => "ERROR",
            Level::Warn => "WARN ",
            Level::Info => "INFO ",
            Level::Debug => "DEBUG",
            Level::Trace => "TRACE",
        };
        // One write per line, so lines of different threads do not interleave.
        let line = format!("{} {level} {}\n", utc_now(), record.args());
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for now.
fn utc_now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Installs the logger at `level` (a flag's value), else `STATEPLANE_LOG`, else info.
pub fn init(level: Option<&str>) -> Result<(), String> {
    let env = std::env::var("STATEPLANE_LOG").ok();
    let (source, text) = match (level, env.as_deref()) {
        (Some(l), _) => ("--log-level", l),
        (None, Some(e)) => ("STATEPLANE_LOG", e),
        (None, None) => ("", "info"),
    };
    let filter: LevelFilter = text.parse().map_err(|_| {
        format!("{source}: '{text}' is not a log level; use one of error, warn, info, debug, trace")
    })?;
    log::set_max_level(filter);
    // A second call (tests) keeps the first logger, which is the same.
    let _ = log::set_logger(&StderrLogger);
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps_are_utc_iso8601() {
        let t = super::utc_now();
        assert_eq!(t.len(), 24, "{t}");
        assert!(
            t.starts_with("20") && t.ends_with('Z') && &t[10..11] == "T",
            "{t}"
        );
    }

    #[test]
    fn a_bad_level_names_the_choices() {
        let e = super::init(Some("loud")).unwrap_err();
        assert!(e.contains("--log-level") && e.contains("debug"), "{e}");
    }
}
