//! `tollbooth`: a byte budget per source address and interval, as an example of a network
//! function written outside Stateplane's built-in set.
//!
//! Each source may send `budget` bytes (on the wire) per interval of `interval_ms`; its
//! packets beyond that are dropped (`over_budget`) until the next interval. Everything else
//! goes from port 0 to 1 and from 1 to 0. The state, `usage` (the bytes each source sent in
//! its current interval), is declared, so `stateplane ctl read usage` shows it and the
//! state services can keep it; entries of sources quiet for two intervals leave.
//!
//! What it shows: settings read with serde and checked with errors that name the field;
//! per-flow state in a declared exact table (add-on-miss, idle expiry); drop reasons; the
//! control plane's view; and a builder to `register` (see `main.rs`).

use serde::Deserialize;
use stateplane_programs::{ConfigError, PortNames, answer_by_table};
use stateplane_runtime::{Burst, Context, DropReason, Program, ProgramFactory, Verdict};
use stateplane_state::control::{Action, Field, Format, ip_value};
use stateplane_state::{
    Declaration, DeclaredTable, ExactCodec, ExactTable, ExpireMode, ExpireProfile, Guarantee, Kind,
    Match, params_into,
};

/// `[program.tollbooth]` in a run's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TollboothConfig {
    /// Bytes a source may send per interval.
    pub budget: u64,
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
    /// Sources tracked per worker.
    #[serde(default = "default_capacity")]
    pub capacity: usize,
}

fn default_interval() -> u64 {
    1000
}

fn default_capacity() -> usize {
    65_536
}

/// What the table keeps per source. Zeroable: a table's empty slots are zeroed memory,
/// touched only as entries arrive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct Usage {
    /// The interval the bytes were counted in (time / interval length).
    pub interval: u32,
    pub bytes: u64,
}

/// How `usage` entries look to the control plane: key the source address, action `used`
/// with the interval and the bytes.
struct UsageCodec;

impl ExactCodec for UsageCodec {
    type Key = u128;
    type Value = Usage;

    fn key(fields: &[Match]) -> u128 {
        match fields.first() {
            Some(Match::Exact(v)) => *v,
            _ => 0,
        }
    }

    fn fields(key: &u128) -> Vec<Match> {
        vec![Match::Exact(*key)]
    }

    fn value(_action: usize, params: &[u128]) -> Usage {
        Usage {
            interval: params.first().copied().unwrap_or(0) as u32,
            bytes: params.get(1).copied().unwrap_or(0) as u64,
        }
    }

    fn action_values(u: &Usage, out: &mut [u128]) -> (usize, usize) {
        (
            0,
            params_into([u128::from(u.interval), u128::from(u.bytes)], out),
        )
    }
}

const OVER_BUDGET: DropReason = DropReason::program(0);

/// One worker's tollbooth. `Clone` gives each worker an empty copy of the table.
#[derive(Clone)]
pub struct Tollbooth {
    budget: u64,
    interval_ns: u64,
    usage: DeclaredTable<UsageCodec>,
}

impl Tollbooth {
    pub fn new(cfg: &TollboothConfig, field: &str) -> Result<Self, ConfigError> {
        if cfg.budget == 0 {
            return Err(ConfigError::new(
                format!("{field}.budget"),
                "give the bytes a source may send per interval, above 0",
            ));
        }
        if !(1..=3_600_000).contains(&cfg.interval_ms) {
            return Err(ConfigError::new(
                format!("{field}.interval_ms"),
                "give 1 to 3600000 milliseconds",
            ));
        }
        if !(1..=1 << 24).contains(&cfg.capacity) {
            return Err(ConfigError::new(
                format!("{field}.capacity"),
                "give 1 to 16777216 sources per worker",
            ));
        }
        let interval_ns = cfg.interval_ms * 1_000_000;
        let declaration = Declaration {
            name: "usage".into(),
            capacity: cfg.capacity,
            guarantees: vec![Guarantee::Local],
            kind: Kind::Table {
                key: vec![Field::exact("src", 128, Format::Ip)],
                actions: vec![Action {
                    name: "used".into(),
                    params: vec![
                        Field::exact("interval", 32, Format::Int),
                        Field::exact("bytes", 64, Format::Int),
                    ],
                }],
                writable: false,
            },
        };
        // A source quiet for two intervals has nothing left to count.
        let idle = ExpireProfile {
            timeout_ns: 2 * interval_ns,
            mode: ExpireMode::AutoDelete,
        };
        Ok(Tollbooth {
            budget: cfg.budget,
            interval_ns,
            usage: DeclaredTable::new(ExactTable::new(cfg.capacity, &[idle], 1), declaration),
        })
    }

    /// Counts `bytes` from `src` at `now`; whether they are within its budget.
    fn pay(&mut self, src: u128, bytes: u64, now: u64) -> bool {
        let interval = (now / self.interval_ns) as u32;
        let Some(id) = self.usage.lookup(&src, now) else {
            let first = Usage { interval, bytes };
            // A full table lets the packet through: the budget is a limit, not a gate.
            let _ = self.usage.add_entry(src, first, 0, now);
            return bytes <= self.budget;
        };
        let u = self.usage.value_mut(id);
        if u.interval != interval {
            *u = Usage { interval, bytes: 0 };
        }
        u.bytes += bytes;
        let within = u.bytes <= self.budget;
        self.usage.restart_timer(id, now);
        within
    }

    /// The bytes `src` has sent in its current interval.
    pub fn used(&self, src: std::net::IpAddr) -> Option<u64> {
        self.usage.get(&ip_value(src)).map(|u| u.bytes)
    }
}

impl Program for Tollbooth {
    type Prepared = ();

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        for d in burst.descs_mut() {
            let out = if d.in_port == 0 { 1 } else { 0 };
            d.verdict = match d.parsed.key.src_ip() {
                Some(src) if !self.pay(ip_value(src), u64::from(d.orig_len), d.ts_ns) => {
                    Verdict::Drop(OVER_BUDGET)
                }
                _ => Verdict::Forward(out),
            };
        }
        // Look at a few slots per burst for sources gone quiet.
        self.usage
            .expire(ctx.now_ns, 16 + 2 * burst.len(), |_, _| {});
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &["over_budget"]
    }

    answer_by_table!(usage);
}

/// Builds the program's factory from its settings: what `register` takes.
pub fn build(
    settings: toml::Value,
    _ports: &PortNames,
    field: &str,
) -> Result<ProgramFactory, ConfigError> {
    stateplane_programs::factory(settings, field, |cfg: &TollboothConfig| {
        Tollbooth::new(cfg, field)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_gen::build::{Hosts, L4, emit_frame};
    use stateplane_wire::{FlowHasher, MacAddr};

    /// A 100-byte UDP frame from `src`.
    fn frame(src: &str) -> Vec<u8> {
        let hosts = Hosts {
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            vlan: 0,
            src: src.parse().unwrap(),
            dst: "198.19.0.1".parse().unwrap(),
            ttl: 64,
        };
        let mut f = Vec::new();
        let l4 = L4::Udp {
            src_port: 1000,
            dst_port: 2000,
        };
        emit_frame(&mut f, &hosts, &l4, &[0u8; 58]);
        f
    }

    /// Runs frames through the program at time `t`, as the runtime would: pushed into a
    /// burst, parsed, processed. Returns their verdicts.
    fn run(p: &mut Tollbooth, t: u64, frames: &[Vec<u8>]) -> Vec<Verdict> {
        let mut burst = Burst::with_capacity(frames.len());
        for (i, f) in frames.iter().enumerate() {
            burst.push(f, f.len() as u32, t, 0, i as u64);
        }
        burst.parse(&FlowHasher::with_seed(1));
        let mut ctx = Context::one_worker(t, FlowHasher::with_seed(1), 2);
        p.process(&mut burst, &mut ctx);
        burst.descs().iter().map(|d| d.verdict).collect()
    }

    #[test]
    fn a_source_over_its_budget_is_dropped_until_the_next_interval() {
        let cfg = TollboothConfig {
            budget: 350,
            interval_ms: 100,
            capacity: 64,
        };
        let mut p = Tollbooth::new(&cfg, "program.tollbooth").unwrap();
        assert_eq!(frame("198.18.0.1").len(), 100);
        let five = vec![frame("198.18.0.1"); 5];
        let v = run(&mut p, 0, &five);
        assert_eq!(
            &v[..3],
            &[Verdict::Forward(1); 3],
            "300 bytes are within 350"
        );
        assert_eq!(&v[3..], &[Verdict::Drop(OVER_BUDGET); 2]);
        // Another source has its own budget.
        assert_eq!(
            run(&mut p, 1, &[frame("198.18.0.2")]),
            [Verdict::Forward(1)]
        );
        // The next interval starts afresh.
        assert_eq!(run(&mut p, 100_000_000, &five[..1]), [Verdict::Forward(1)]);
        assert_eq!(p.used("198.18.0.1".parse().unwrap()), Some(100));
    }

    #[test]
    fn settings_errors_name_the_field() {
        let err = |text: &str| {
            build(
                toml::from_str(text).unwrap(),
                &PortNames(vec![]),
                "program.tollbooth",
            )
            .err()
            .unwrap()
        };
        assert_eq!(err("budget = 0").field, "program.tollbooth.budget");
        assert_eq!(
            err("budget = 10\ninterval_ms = 0").field,
            "program.tollbooth.interval_ms"
        );
        assert!(err("budjet = 10").problem.contains("budjet"));
    }
}
