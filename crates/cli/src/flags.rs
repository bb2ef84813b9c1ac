//! Checks that several commands' flags share, each error naming the flag and the fix.

use crate::summary_output::CliResult;
use std::net::SocketAddr;
use std::time::Duration;

/// `--seconds`: how long a command runs at most (where `None`, as long as its work or
/// until SIGINT or SIGTERM), more than 0 and at most `most` seconds.
pub(crate) fn seconds(seconds: Option<f64>, most: f64) -> CliResult<Option<Duration>> {
    length("--seconds", "a length to run for", seconds, most)
}

/// `--timeout`: how long a watch waits without a notification before it ends (where
/// `None`, without end), more than 0 and at most a year.
pub(crate) fn timeout(timeout: Option<f64>) -> CliResult<Option<Duration>> {
    length("--timeout", "a time to wait", timeout, 31_536_000.0)
}

/// A length of time `flag` gives in seconds, more than 0 and at most `most`: anything
/// else (negative, NaN, past `most`) is refused, where a `Duration` made of it would panic.
fn length(flag: &str, what: &str, seconds: Option<f64>, most: f64) -> CliResult<Option<Duration>> {
    match seconds {
        Some(s) if s > 0.0 && s <= most => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(format!(
            "{flag}: {s} is not {what}; give more than 0 and at most {most}, or leave it out"
        )),
        None => Ok(None),
    }
}

/// An address `flag` names, like `example` (`127.0.0.1:7474`).
pub(crate) fn address(flag: &str, text: &str, example: &str) -> CliResult<SocketAddr> {
    (text.parse()).map_err(|_| format!("{flag}: '{text}' is not an address like {example}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_length_of_zero_or_past_the_most_is_refused_with_the_range() {
        assert_eq!(seconds(None, 10.0), Ok(None));
        assert_eq!(
            seconds(Some(2.5), 10.0),
            Ok(Some(Duration::from_millis(2500)))
        );
        assert_eq!(seconds(Some(10.0), 10.0), Ok(Some(Duration::from_secs(10))));
        for bad in [0.0, -1.0, 10.5, f64::NAN, f64::INFINITY] {
            let err = seconds(Some(bad), 10.0).unwrap_err();
            assert!(
                err.contains("give more than 0 and at most 10"),
                "{bad}: {err}"
            );
        }
        for bad in [-1.0, f64::NAN, 1e12] {
            let err = timeout(Some(bad)).unwrap_err();
            assert!(err.starts_with("--timeout: "), "{bad}: {err}");
        }
        assert_eq!(timeout(Some(0.5)), Ok(Some(Duration::from_millis(500))));
        assert!(
            address("--to", "127.0.0.1", "127.0.0.1:7474")
                .unwrap_err()
                .contains("--to: '127.0.0.1'")
        );
    }
}
