//! Multi-table rule pipelines in the OpenFlow style, and their microflow cache.
//!
//! Owns: the fields rules match on, taken once per packet ([`fields`]); rules with
//! prioritized wildcard patterns, port ranges, cookies, timeouts and instructions
//! ([`rule`]); their one-rule-per-line text format ([`rule_text`]); the walk through
//! numbered tables ([`ruleset`]), each searched by a decision tree (`tree`) or by merged
//! tuples with an index each (`tuple`), with the reference scan that every faster
//! classifier and the cache must agree with; the microflow cache's structure ([`cache`]:
//! sets of 1, 2 or 4 ways, signatures, pseudo-LRU); and the cached pipeline in front of the rules ([`cached`]: the Action
//! Table and the consistency modes); [`apply`] puts a walk's actions onto a packet.
//!
//! Must never: read a clock, allocate on a cache hit, or give a packet processed after an
//! update was acknowledged a result the new rule set would not give.

pub mod apply;
pub mod cache;
pub mod cached;
pub mod fields;
pub mod rule;
pub mod rule_text;
pub mod ruleset;
#[cfg(test)]
mod testing;
mod tree;
mod tuple;

pub use cache::{CacheStats, MicroflowCache};
pub use cached::{CachedPipeline, Consistency, Probe, RuleStat, Timeout};
pub use fields::Fields;
pub use rule::{Action, Pattern, Rule, SetField};
pub use rule_text::{RuleParseError, RuleWarning, format_rule, parse_rule, parse_rule_warning};
pub use ruleset::{Miss, Outcome, RuleError, RuleId, RuleSet, TREE_RULES};
pub use tree::{BYTES_A_RULE as TREE_BYTES_A_RULE, TreeShape};
