//! What a reload did with a program's state: each piece kept, kept with losses, started
//! afresh, or made again from the configuration, and why, for the run to say so.
//!
//! Must never: describe state as kept that the new program does not hold.

use std::fmt;

/// What a reload did with one piece of declared state (by its name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    pub name: String,
    /// Entries the new program holds as the old one held them.
    pub kept: u64,
    /// Entries left behind.
    pub dropped: u64,
    pub fate: Fate,
}

/// How the state came across.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Whole: every entry is kept.
    Whole,
    /// Kept but for the entries dropped, for this reason.
    LeftBehind(String),
    /// Nothing came across, for this reason: the state starts empty.
    Afresh(String),
    /// The state is the configuration's, made again from it (entries the control plane
    /// wrote since give way to it).
    Configured,
}

impl Carried {
    /// The state came across, `kept` entries, leaving `dropped` behind for `why` (if any).
    pub fn entries(name: &str, kept: u64, dropped: u64, why: &str) -> Carried {
        Carried {
            name: name.to_owned(),
            kept,
            dropped,
            fate: match dropped {
                0 => Fate::Whole,
                _ => Fate::LeftBehind(why.to_owned()),
            },
        }
    }

    /// The new program starts this state afresh, for `why` (its entries not counted).
    pub fn afresh(name: &str, why: impl Into<String>) -> Carried {
        Carried {
            name: name.to_owned(),
            kept: 0,
            dropped: 0,
            fate: Fate::Afresh(why.into()),
        }
    }

    /// The state is made again from the new configuration.
    pub fn configured(name: &str) -> Carried {
        Carried {
            name: name.to_owned(),
            kept: 0,
            dropped: 0,
            fate: Fate::Configured,
        }
    }

    /// Leaves `n` of the entries counted kept behind after all, for `why`.
    pub fn leave_behind(&mut self, n: u64, why: &str) {
        if n == 0 {
            return;
        }
        self.kept = self.kept.saturating_sub(n);
        self.dropped += n;
        self.fate = Fate::LeftBehind(match &self.fate {
            Fate::LeftBehind(before) => format!("{before}; {why}"),
            _ => why.to_owned(),
        });
    }

    /// Whether state was lost: entries left behind, or a state started afresh.
    pub fn lost(&self) -> bool {
        matches!(self.fate, Fate::LeftBehind(_) | Fate::Afresh(_))
    }
}

impl fmt::Display for Carried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, kept, dropped) = (&self.name, self.kept, self.dropped);
        match &self.fate {
            Fate::Whole => write!(f, "{name}: kept {kept} entries"),
            Fate::LeftBehind(why) => {
                write!(f, "{name}: kept {kept} entries, dropped {dropped} ({why})")
            }
            Fate::Afresh(why) => write!(f, "{name}: starts afresh ({why})"),
            Fate::Configured => write!(f, "{name}: made again from the configuration"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_what_came_across_and_why_the_rest_did_not() {
        let whole = Carried::entries("translations", 7, 0, "unused");
        assert!(!whole.lost());
        assert_eq!(whole.to_string(), "translations: kept 7 entries");
        let partly = Carried::entries("connections", 5, 2, "the new capacity holds fewer");
        assert!(partly.lost());
        assert_eq!(
            partly.to_string(),
            "connections: kept 5 entries, dropped 2 (the new capacity holds fewer)"
        );
        let mut more = partly.clone();
        more.leave_behind(0, "nothing");
        assert_eq!(more, partly);
        more.leave_behind(1, "their backend left");
        assert_eq!(
            more.to_string(),
            "connections: kept 4 entries, dropped 3 (the new capacity holds fewer; their \
             backend left)"
        );
        let afresh = Carried::afresh("macs", "the program changed");
        assert!(afresh.lost());
        assert_eq!(
            afresh.to_string(),
            "macs: starts afresh (the program changed)"
        );
        let configured = Carried::configured("routes");
        assert!(!configured.lost());
        assert_eq!(
            configured.to_string(),
            "routes: made again from the configuration"
        );
    }
}
