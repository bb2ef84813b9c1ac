//! The memory a run may take, checked before anything large is allocated.
//!
//! A run's loader opens a [`scope`] with the [`Budget`] (a limit in bytes, and how many
//! copies of the program's state the run keeps: one per worker and a few more); whatever
//! sizes a table, sketch, ring or buffer from the configuration [`claim`]s its bytes first,
//! and a claim that would take the run past the limit is refused with what was asked, the
//! total, the limit and the fix, so that a capacity typed one digit too long is an error
//! at start rather than the kernel killing the process after it has allocated gigabytes.
//!
//! Must never: allocate, or refuse anything outside a scope (code that builds state for
//! itself, as tests and benchmarks do, claims nothing).

use std::cell::RefCell;
use std::fmt;

/// What a run may take: `limit` bytes in all, its program's state kept `copies` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub limit: u64,
    pub copies: u64,
    /// What the fix names: the setting that raises the limit.
    pub setting: &'static str,
}

/// A claim the budget refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverBudget {
    /// What asked (e.g. "65536 entries"), its bytes, and the copies of it the run keeps
    /// (1 for what the caller counted in all).
    pub what: String,
    pub bytes: u64,
    pub copies: u64,
    /// Claimed before this claim, and the limit.
    pub claimed: u64,
    pub limit: u64,
    pub setting: &'static str,
}

impl fmt::Display for OverBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let all = self.bytes.saturating_mul(self.copies);
        write!(f, "{} take {}", self.what, Bytes(self.bytes))?;
        if self.copies > 1 {
            write!(
                f,
                " in each of {} copies (one a worker, and the run's own), {} in all",
                self.copies,
                Bytes(all)
            )?;
        }
        write!(
            f,
            "; with the {} claimed before, that is past the memory budget of {}: make it \
             smaller, run fewer workers, or raise {}",
            Bytes(self.claimed),
            Bytes(self.limit),
            self.setting
        )
    }
}

impl std::error::Error for OverBudget {}

/// What a scope's claims came to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Claimed {
    pub bytes: u64,
    pub limit: u64,
}

struct Ledger {
    budget: Budget,
    claimed: u64,
}

thread_local! {
    static LEDGER: RefCell<Option<Ledger>> = const { RefCell::new(None) };
}

/// Runs `load` with `budget` as the limit of this thread's claims: its result, and what
/// they came to. Scopes do not nest (an inner one replaces the outer for its duration).
pub fn scope<T>(budget: Budget, load: impl FnOnce() -> T) -> (T, Claimed) {
    let outer = LEDGER.with(|l| l.replace(Some(Ledger { budget, claimed: 0 })));
    let result = load();
    let ledger = LEDGER.with(|l| l.replace(outer));
    let claimed = ledger.map_or(0, |l| l.claimed);
    (
        result,
        Claimed {
            bytes: claimed,
            limit: budget.limit,
        },
    )
}

/// Claims `bytes` for state every copy of the program keeps (see [`Budget::copies`]).
pub fn claim(what: impl FnOnce() -> String, bytes: u64) -> Result<(), OverBudget> {
    claim_copies(what, bytes, None)
}

/// Claims `bytes` the run takes once (the caller counted every worker's share).
pub fn claim_once(what: impl FnOnce() -> String, bytes: u64) -> Result<(), OverBudget> {
    claim_copies(what, bytes, Some(1))
}

fn claim_copies(
    what: impl FnOnce() -> String,
    bytes: u64,
    copies: Option<u64>,
) -> Result<(), OverBudget> {
    LEDGER.with(|l| {
        let mut ledger = l.borrow_mut();
        let Some(ledger) = ledger.as_mut() else {
            return Ok(());
        };
        let copies = copies.unwrap_or(ledger.budget.copies);
        let total = ledger.claimed.saturating_add(bytes.saturating_mul(copies));
        if total > ledger.budget.limit {
            return Err(OverBudget {
                what: what(),
                bytes,
                copies,
                claimed: ledger.claimed,
                limit: ledger.budget.limit,
                setting: ledger.budget.setting,
            });
        }
        ledger.claimed = total;
        Ok(())
    })
}

/// This machine's memory (MemTotal), if the kernel says.
pub fn machine_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The default limit: three quarters of the machine's memory (the rest for the system and
/// what the budget does not count: code, stacks, small allocations); 4 GiB where the
/// kernel does not say.
pub fn default_limit() -> u64 {
    machine_memory().map_or(4 << 30, |m| m / 4 * 3)
}

/// Bytes as people read them: `20.0 GiB`, `512 B`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        match unit {
            0 => write!(f, "{} B", self.0),
            _ => write!(f, "{value:.1} {}", UNITS[unit]),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const GIB: u64 = 1 << 30;

    fn budget(limit: u64, copies: u64) -> Budget {
        Budget {
            limit,
            copies,
            setting: "memory_budget",
        }
    }

    #[test]
    fn claims_add_up_per_copy_and_the_one_past_the_limit_is_refused_whole() {
        let ((), claimed) = scope(budget(9 * GIB, 4), || {
            claim(|| "a".into(), GIB).unwrap();
            claim_once(|| "b".into(), 2 * GIB).unwrap();
            let refused = claim(|| "65536 entries".into(), GIB).unwrap_err();
            assert_eq!((refused.claimed, refused.copies), (6 * GIB, 4));
            assert_eq!(
                refused.to_string(),
                "65536 entries take 1.0 GiB in each of 4 copies (one a worker, and the \
                 run's own), 4.0 GiB in all; with the 6.0 GiB claimed before, that is past \
                 the memory budget of 9.0 GiB: make it smaller, run fewer workers, or \
                 raise memory_budget"
            );
            // Exactly to the limit is taken; the refused claim took nothing.
            claim_once(|| "c".into(), 3 * GIB).unwrap();
            assert!(claim_once(|| "d".into(), 1).is_err());
        });
        assert_eq!(claimed.bytes, 9 * GIB);
    }

    #[test]
    fn outside_a_scope_nothing_is_refused_and_sizes_never_overflow() {
        claim(|| "anything".into(), u64::MAX).unwrap();
        let ((), _) = scope(budget(u64::MAX, u64::MAX), || {
            assert!(claim(|| "x".into(), u64::MAX).is_ok());
            assert!(claim(|| "y".into(), 1).is_ok(), "saturates at the limit");
        });
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(3 << 29).to_string(), "1.5 GiB");
        assert!(default_limit() > 0);
    }
}
