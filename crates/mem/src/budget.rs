//! The memory a run may take, checked before anything large is allocated.
//!
//! A run's loader opens a [`scope`] with the [`Budget`] (a limit in bytes, and how many
//! copies of the program's state the run keeps: one per worker and a few more); whatever
//! sizes a table, sketch, ring or buffer from the configuration [`claim`]s its bytes first,
//! and a claim that would take the run past the limit is refused with what was asked, the
//! total, the limit and the fix, so that a capacity typed one digit too long is an error
//! at start rather than the kernel killing the process after it has allocated gigabytes.
//! Each claim names the setting that sized it, and the scope keeps what each holds
//! ([`Share`]), so that a run can say where its memory went.
//!
//! Must never: allocate, or refuse anything outside a scope (code that builds state for
//! itself, as tests and benchmarks do, claims nothing).

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

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

/// What a scope's claims came to: in all, and by setting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claimed {
    pub bytes: u64,
    pub limit: u64,
    pub shares: Vec<Share>,
}

/// What one setting holds of the budget: the setting that sized it, as errors name it
/// (`program.conntrack.capacity`), or for what grows as the run goes on, what it is
/// (`routes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Share {
    pub setting: String,
    /// Bytes in each copy, and the copies the run keeps of it.
    pub each: u64,
    pub copies: u64,
}

impl Share {
    /// Its bytes in all copies.
    pub fn bytes(&self) -> u64 {
        self.each.saturating_mul(self.copies)
    }
}

/// A scope's claims, shared with the [`Growth`] handles taken in it.
#[derive(Debug)]
struct Ledger {
    budget: Budget,
    /// The sum of `shares`' bytes (kept apart so that a claim is checked without the lock).
    claimed: AtomicU64,
    shares: Mutex<Vec<Share>>,
}

impl Ledger {
    fn new(budget: Budget) -> Ledger {
        Ledger {
            budget,
            claimed: AtomicU64::new(0),
            shares: Mutex::new(Vec::new()),
        }
    }

    /// Adds `bytes * copies` to `setting`'s share unless that passes the limit (then
    /// nothing is added).
    fn claim(
        &self,
        setting: &str,
        what: impl FnOnce() -> String,
        bytes: u64,
        copies: u64,
    ) -> Result<(), OverBudget> {
        let all = bytes.saturating_mul(copies);
        let taken = self
            .claimed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |claimed| {
                let total = claimed.saturating_add(all);
                (total <= self.budget.limit).then_some(total)
            });
        if let Err(claimed) = taken {
            return Err(OverBudget {
                what: what(),
                bytes,
                copies,
                claimed,
                limit: self.budget.limit,
                setting: self.budget.setting,
            });
        }
        let mut shares = self.shares.lock().unwrap_or_else(PoisonError::into_inner);
        match shares.iter_mut().find(|s| s.setting == setting) {
            Some(share) if share.copies == copies => share.each = share.each.saturating_add(bytes),
            // Kept in a different number of copies: held as one sum.
            Some(share) => {
                (share.each, share.copies) = (share.bytes().saturating_add(all), 1);
            }
            None => shares.push(Share {
                setting: setting.to_owned(),
                each: bytes,
                copies,
            }),
        }
        Ok(())
    }

    /// Takes `bytes` (in all copies) off `setting`'s share; never below zero.
    fn give(&self, setting: &str, bytes: u64) {
        let mut shares = self.shares.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(share) = shares.iter_mut().find(|s| s.setting == setting) else {
            return;
        };
        // Whole copies only, so that the total stays the sum of the shares.
        let copies = share.copies.max(1);
        let each = (bytes / copies).min(share.each);
        share.each -= each;
        let given = each * copies;
        let _ = self
            .claimed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(given))
            });
    }

    fn shares(&self) -> Vec<Share> {
        (self.shares.lock().unwrap_or_else(PoisonError::into_inner)).clone()
    }
}

thread_local! {
    static LEDGER: RefCell<Option<Arc<Ledger>>> = const { RefCell::new(None) };
}

/// Runs `load` with `budget` as the limit of this thread's claims: its result, and what
/// they came to. Scopes do not nest (an inner one replaces the outer for its duration).
pub fn scope<T>(budget: Budget, load: impl FnOnce() -> T) -> (T, Claimed) {
    let ledger = Arc::new(Ledger::new(budget));
    let outer = LEDGER.with(|l| l.replace(Some(ledger.clone())));
    let result = load();
    LEDGER.with(|l| l.replace(outer));
    (
        result,
        Claimed {
            bytes: ledger.claimed.load(Ordering::Relaxed),
            limit: budget.limit,
            shares: ledger.shares(),
        },
    )
}

/// Claims `bytes` that `setting` sized, for state every copy of the program keeps (see
/// [`Budget::copies`]).
pub fn claim(setting: &str, what: impl FnOnce() -> String, bytes: u64) -> Result<(), OverBudget> {
    claim_copies(setting, what, bytes, None)
}

/// Claims `bytes` that `setting` sized, taken once (the caller counted every worker's
/// share).
pub fn claim_once(
    setting: &str,
    what: impl FnOnce() -> String,
    bytes: u64,
) -> Result<(), OverBudget> {
    claim_copies(setting, what, bytes, Some(1))
}

fn claim_copies(
    setting: &str,
    what: impl FnOnce() -> String,
    bytes: u64,
    copies: Option<u64>,
) -> Result<(), OverBudget> {
    LEDGER.with(|l| match l.borrow().as_ref() {
        Some(ledger) => ledger.claim(setting, what, bytes, copies.unwrap_or(ledger.budget.copies)),
        None => Ok(()),
    })
}

/// The budget's remainder for what grows while the run goes on (routes and rules written
/// through the control API, packets held for a store): taken in the run's loading scope,
/// it claims from that scope's ledger from any thread, after loading too, and what it
/// gives back can be claimed again. Taken outside a scope, it refuses nothing.
#[derive(Clone, Debug, Default)]
pub struct Growth {
    ledger: Option<Arc<Ledger>>,
}

impl Growth {
    /// The current scope's (unlimited outside one).
    pub fn of_scope() -> Growth {
        Growth {
            ledger: LEDGER.with(|l| l.borrow().clone()),
        }
    }

    /// Claims `bytes` for `setting` (what grows, e.g. `routes`), taken once (the caller
    /// counted every copy).
    pub fn take(
        &self,
        setting: &str,
        what: impl FnOnce() -> String,
        bytes: u64,
    ) -> Result<(), OverBudget> {
        match &self.ledger {
            Some(ledger) => ledger.claim(setting, what, bytes, 1),
            None => Ok(()),
        }
    }

    /// Gives back `bytes` taken before for `setting` (never more than it holds).
    pub fn give(&self, setting: &str, bytes: u64) {
        if let Some(ledger) = &self.ledger {
            ledger.give(setting, bytes);
        }
    }

    /// What each setting holds now, in the order first claimed (none outside a scope).
    pub fn shares(&self) -> Vec<Share> {
        self.ledger.as_ref().map_or_else(Vec::new, |l| l.shares())
    }

    /// The scope's limit (none outside one).
    pub fn limit(&self) -> Option<u64> {
        self.ledger.as_ref().map(|l| l.budget.limit)
    }

    /// How many copies of the program's state the run keeps (1 outside a scope).
    pub fn copies(&self) -> u64 {
        self.ledger.as_ref().map_or(1, |l| l.budget.copies)
    }

    /// What the run has claimed now, loading and growth together (0 outside a scope).
    pub fn claimed(&self) -> u64 {
        self.ledger
            .as_ref()
            .map_or(0, |l| l.claimed.load(Ordering::Relaxed))
    }
}

/// Keeps what a growing structure has taken from a [`Growth`] in line with what it
/// uses: taken in steps of at least `step` bytes (so that a structure growing a little at
/// a time asks rarely), given back once it uses less than half of what it holds.
#[derive(Debug, Default)]
pub struct Allowance {
    growth: Growth,
    /// What the structure is, as the run's shares name it (`routes`).
    setting: String,
    held: u64,
}

impl Allowance {
    pub fn new(growth: Growth, setting: &str) -> Allowance {
        Allowance {
            growth,
            setting: setting.to_owned(),
            held: 0,
        }
    }

    /// Makes the allowance cover `bytes` in use; refused, it holds what it held.
    pub fn cover(
        &mut self,
        what: impl FnOnce() -> String,
        bytes: u64,
        step: u64,
    ) -> Result<(), OverBudget> {
        if bytes > self.held {
            let need = bytes - self.held;
            // A whole step where it fits; near the limit, only what is needed.
            let (growth, setting) = (&self.growth, &self.setting);
            let more = match growth.take(setting, String::new, need.max(step)) {
                Ok(()) => need.max(step),
                Err(_) => growth.take(setting, what, need).map(|()| need)?,
            };
            self.held += more;
        } else if bytes < self.held / 2 {
            self.growth.give(&self.setting, self.held - bytes);
            self.held = bytes;
        }
        Ok(())
    }

    /// How many copies of the program's state the run keeps (see [`Growth::copies`]).
    pub fn copies(&self) -> u64 {
        self.growth.copies()
    }

    /// What it holds now.
    pub fn held(&self) -> u64 {
        self.held
    }
}

impl Drop for Allowance {
    fn drop(&mut self) {
        self.growth.give(&self.setting, self.held);
    }
}

/// This machine's memory (MemTotal), if the kernel says.
pub fn machine_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Which of this process's resident memory [`resident`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resident {
    /// What it holds now (`VmRSS`).
    Now,
    /// The most it has held (`VmHWM`).
    Peak,
}

/// This process's resident memory in bytes, as the kernel counts it (the pages touched,
/// where the budget counts every table whole), if the kernel says.
pub fn resident(which: Resident) -> Option<u64> {
    let field = match which {
        Resident::Now => "VmRSS:",
        Resident::Peak => "VmHWM:",
    };
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
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
            claim("s", || "a".into(), GIB).unwrap();
            claim_once("s", || "b".into(), 2 * GIB).unwrap();
            let refused = claim("s", || "65536 entries".into(), GIB).unwrap_err();
            assert_eq!((refused.claimed, refused.copies), (6 * GIB, 4));
            assert_eq!(
                refused.to_string(),
                "65536 entries take 1.0 GiB in each of 4 copies (one a worker, and the \
                 run's own), 4.0 GiB in all; with the 6.0 GiB claimed before, that is past \
                 the memory budget of 9.0 GiB: make it smaller, run fewer workers, or \
                 raise memory_budget"
            );
            // Exactly to the limit is taken; the refused claim took nothing.
            claim_once("s", || "c".into(), 3 * GIB).unwrap();
            assert!(claim_once("s", || "d".into(), 1).is_err());
        });
        assert_eq!(claimed.bytes, 9 * GIB);
    }

    #[test]
    fn each_setting_holds_what_it_claimed_in_each_copy_and_what_grows_as_it_grows() {
        let (growth, claimed) = scope(budget(10 * GIB, 3), || {
            claim("program.kv.capacity", String::new, GIB).unwrap();
            claim("program.kv.capacity", String::new, GIB).unwrap();
            claim_once("burst", String::new, 5).unwrap();
            // Refused: nothing held.
            assert!(claim("program.hh.width", String::new, 4 * GIB).is_err());
            // The same setting in other copies: held as one sum.
            claim_once("program.kv.capacity", String::new, 7).unwrap();
            Growth::of_scope()
        });
        let share = |setting: &str, each, copies| Share {
            setting: setting.into(),
            each,
            copies,
        };
        assert_eq!(
            claimed.shares,
            [
                share("program.kv.capacity", 6 * GIB + 7, 1),
                share("burst", 5, 1)
            ]
        );
        assert_eq!(claimed.bytes, 6 * GIB + 12);
        let mut routes = Allowance::new(growth.clone(), "routes");
        routes.cover(String::new, 100, 0).unwrap();
        assert_eq!(growth.shares()[2], share("routes", 100, 1));
        routes.cover(String::new, 10, 0).unwrap();
        assert_eq!(growth.shares()[2], share("routes", 10, 1), "given back");
        drop(routes);
        assert_eq!(growth.shares()[2], share("routes", 0, 1));
        assert_eq!(growth.claimed(), 6 * GIB + 12);
        assert_eq!(growth.limit(), Some(10 * GIB));
        assert!(Growth::of_scope().shares().is_empty());
    }

    #[test]
    fn growth_claims_from_the_scope_after_it_ends_and_from_other_threads() {
        let (growth, claimed) = scope(budget(10 * GIB, 2), || {
            claim("s", || "tables".into(), 2 * GIB).unwrap();
            Growth::of_scope()
        });
        assert_eq!((claimed.bytes, growth.copies()), (4 * GIB, 2));
        let other = growth.clone();
        std::thread::spawn(move || other.take("routes", || "routes".into(), 5 * GIB).unwrap())
            .join()
            .unwrap();
        let refused = growth
            .take("routes", || "more routes".into(), 2 * GIB)
            .unwrap_err();
        assert_eq!(
            (refused.claimed, refused.limit, refused.copies),
            (9 * GIB, 10 * GIB, 1)
        );
        assert_eq!(growth.claimed(), 9 * GIB, "a refusal takes nothing");
        growth.give("routes", 5 * GIB);
        growth
            .take("routes", || "more routes".into(), 2 * GIB)
            .unwrap();
        assert_eq!(growth.claimed(), 6 * GIB);
        growth.give("routes", u64::MAX);
        assert_eq!(
            growth.claimed(),
            4 * GIB,
            "never below zero, the tables kept"
        );
        growth.take("routes", String::new, 3).unwrap();
        growth.give("rules", 3);
        assert_eq!(
            growth.claimed(),
            4 * GIB + 3,
            "what another setting holds is not given"
        );
        // Outside a scope: nothing refused, nothing counted.
        let free = Growth::of_scope();
        assert!(free.take("routes", || "x".into(), u64::MAX).is_ok());
        assert_eq!((free.claimed(), free.copies()), (0, 1));
    }

    #[test]
    fn an_allowance_takes_in_steps_gives_back_below_half_and_on_drop() {
        const MIB: u64 = 1 << 20;
        let (growth, _) = scope(budget(10 * MIB, 1), Growth::of_scope);
        let mut a = Allowance::new(growth.clone(), "held packets");
        a.cover(|| "held packets".into(), 1500, MIB).unwrap();
        assert_eq!((a.held(), growth.claimed()), (MIB, MIB), "a whole step");
        a.cover(|| "held packets".into(), MIB, MIB).unwrap();
        assert_eq!(growth.claimed(), MIB, "covered: nothing asked");
        a.cover(|| "held packets".into(), 9 * MIB + 1, 4 * MIB)
            .unwrap();
        assert_eq!(
            growth.claimed(),
            9 * MIB + 1,
            "near the limit, only the need"
        );
        let refused = a
            .cover(|| "held packets".into(), 11 * MIB, MIB)
            .unwrap_err();
        assert_eq!(refused.what, "held packets");
        assert_eq!(a.held(), 9 * MIB + 1, "a refusal holds what it held");
        a.cover(|| "held packets".into(), 5 * MIB, MIB).unwrap();
        assert_eq!(growth.claimed(), 9 * MIB + 1, "half or more in use: kept");
        a.cover(|| "held packets".into(), MIB, MIB).unwrap();
        assert_eq!(
            (a.held(), growth.claimed()),
            (MIB, MIB),
            "below half: given back"
        );
        drop(a);
        assert_eq!(growth.claimed(), 0);
    }

    #[test]
    fn outside_a_scope_nothing_is_refused_and_sizes_never_overflow() {
        claim("s", || "anything".into(), u64::MAX).unwrap();
        let ((), _) = scope(budget(u64::MAX, u64::MAX), || {
            assert!(claim("s", || "x".into(), u64::MAX).is_ok());
            assert!(
                claim("s", || "y".into(), 1).is_ok(),
                "saturates at the limit"
            );
        });
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(3 << 29).to_string(), "1.5 GiB");
        assert!(default_limit() > 0);
        let (now, peak) = (resident(Resident::Now), resident(Resident::Peak));
        assert!(now.is_some_and(|n| n > 0 && peak.is_some_and(|p| p >= n)));
    }
}
