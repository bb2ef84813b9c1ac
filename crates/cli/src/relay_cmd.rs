//! `stateplane relay`: a UDP relay that loses, duplicates and delays datagrams both ways at
//! given rates: fault injection on the sync channel between real switches and a collector.

use crate::summary_output::CliResult;
use stateplane_switch::relay::{self, RelaySettings};
use stateplane_sync::channel::Faults;

#[derive(clap::Args)]
pub struct RelayArgs {
    /// Where the relay listens (the switches' `[sync] collector`).
    #[arg(long)]
    pub listen: String,
    /// Where it relays to (the collector's `--listen`).
    #[arg(long)]
    pub to: String,
    /// Chance that a datagram is lost, each way (0 to 1).
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Chance that a datagram arrives twice, each way (0 to 1).
    #[arg(long, default_value_t = 0.0)]
    pub duplicate: f64,
    /// Each datagram is delayed by up to this many milliseconds, drawn uniformly (which
    /// reorders them).
    #[arg(long, default_value_t = 0.0)]
    pub delay_ms: f64,
    /// Seed of the faults drawn (loss, delay): the same seed draws the same ones.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop after this many seconds (else at SIGINT or SIGTERM).
    #[arg(long)]
    pub seconds: Option<f64>,
}

pub fn main(a: RelayArgs) -> CliResult<()> {
    for (flag, p) in [("--loss", a.loss), ("--duplicate", a.duplicate)] {
        if !(0.0..=1.0).contains(&p) {
            return Err(format!("{flag}: {p} is not a chance from 0 to 1"));
        }
    }
    if !(0.0..=10_000.0).contains(&a.delay_ms) {
        return Err(format!("--delay-ms: {} is outside 0 to 10000", a.delay_ms));
    }
    let duration = crate::flags::seconds(a.seconds, 31_536_000.0)?;
    let settings = RelaySettings {
        listen: crate::flags::address("--listen", &a.listen, "127.0.0.1:7474")?,
        target: stateplane_switch::units::destination("--to", &a.to)?,
        faults: Faults {
            loss: a.loss,
            duplicate: a.duplicate,
            max_delay_ns: (a.delay_ms * 1e6) as u64,
        },
        seed: a.seed,
        duration,
    };
    let (socket, listening) = relay::bind(&settings)?;
    let stop = stateplane_switch::collector::stop_on_signals()?;
    eprintln!("relay listening on {listening}, to {}", settings.target);
    let outcome = relay::run(&settings, socket, stop)?;
    print!("{}", outcome.table());
    Ok(())
}
