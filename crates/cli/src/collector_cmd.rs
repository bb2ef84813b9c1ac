//! `stateplane collector`: takes the sync messages of switches whose state is `synced`
//! (a run's `[guarantees]` and `[sync]`), holds their copy in memory with a bound per
//! location, and reports back to each stream (docs/SYNC.md).

use crate::summary_output::CliResult;
use stateplane_stores::redis_client::{RedisTls, TlsFiles};
use stateplane_switch::collector::{self, CollectorSettings};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct CollectorArgs {
    /// The UDP address to listen on (a switch's `[sync] collector`).
    #[arg(long, default_value = "127.0.0.1:7474")]
    pub listen: String,
    /// The key file the switches sign with (64 hexadecimal digits); messages without its
    /// MAC are refused.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Take only these switch ids (comma-separated); the others are refused.
    #[arg(long, value_delimiter = ',')]
    pub switches: Option<Vec<u32>>,
    /// Report to each stream this often, in milliseconds (the switches' rate controllers
    /// lower their rate on reported loss).
    #[arg(long, default_value_t = 10)]
    pub report_ms: u64,
    /// Stop after this many seconds (else at SIGINT or SIGTERM).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Write every location held, with its bound, to this CSV file at the end.
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// Serve the collector's API (gRPC: reads with bounds, writes, streams, subscriptions;
    /// `stateplane ctl --server ADDR sync ...`) on this loopback address.
    #[arg(long)]
    pub api: Option<String>,
    /// Write the copy through to Redis as it is applied (`redis://127.0.0.1:6379`): a hash
    /// per stream and state, `stateplane:sync:SWITCH:STREAM:STATE`, index to value.
    #[arg(long)]
    pub redis: Option<String>,
    /// With a `rediss://` URL (Redis over TLS): the certificate (PEM) of the CA that signed
    /// the server's; without it, the system's roots.
    #[arg(long)]
    pub redis_ca: Option<PathBuf>,
    /// With a `rediss://` URL: this collector's certificate (PEM), for a server that asks
    /// its clients for one (`tls-auth-clients`).
    #[arg(long)]
    pub redis_cert: Option<PathBuf>,
    /// The key of `--redis-cert` (PEM).
    #[arg(long)]
    pub redis_key: Option<PathBuf>,
    /// Serve Prometheus metrics on this loopback address (`GET /metrics`): what was
    /// applied and refused, each stream's age, threshold and loss, Redis's writes.
    #[arg(long)]
    pub metrics: Option<String>,
    /// The locations the copy holds at most, over every stream (16 bytes each; the
    /// default, 67108864, is 1 GiB); messages that would add more are refused as `full`
    /// and counted.
    #[arg(long, default_value_t = stateplane_sync::mirror::DEFAULT_MAX_LOCATIONS)]
    pub max_locations: usize,
}

pub fn main(a: CollectorArgs) -> CliResult<()> {
    let listen = crate::flags::address("--listen", &a.listen, "127.0.0.1:7474")?;
    if !(1..=60_000).contains(&a.report_ms) {
        return Err(format!(
            "--report-ms: {} is outside 1 to 60000",
            a.report_ms
        ));
    }
    let duration = crate::flags::seconds(a.seconds, 31_536_000.0)?;
    let api = (a.api.as_deref())
        .map(|text| crate::flags::address("--api", text, "127.0.0.1:9560"))
        .transpose()?;
    let metrics = (a.metrics.as_deref())
        .map(|m| stateplane_switch::metrics::parse_addr("--metrics", m, "127.0.0.1:9465"))
        .transpose()?;
    if a.max_locations < stateplane_sync::mirror::CELLS_A_STREAM {
        return Err(format!(
            "--max-locations: {} is too few to hold one stream; give at least {}",
            a.max_locations,
            stateplane_sync::mirror::CELLS_A_STREAM
        ));
    }
    let files = TlsFiles::of_flags(
        a.redis_ca.as_deref(),
        a.redis_cert.as_deref(),
        a.redis_key.as_deref(),
    );
    let redis_tls = RedisTls::load_for(a.redis.as_deref(), "--redis", files)?;
    let settings = CollectorSettings {
        redis_tls,
        max_locations: a.max_locations,
        metrics,
        redis: a.redis,
        api,
        listen,
        key_file: a.key_file,
        switches: a.switches,
        report_every: Duration::from_millis(a.report_ms),
        duration,
        dump: a.dump,
    };
    let bound = collector::bind(&settings)?;
    let stop = collector::stop_on_signals()?;
    eprintln!("collector listening on {}", bound.addr);
    if let Some(api) = &bound.api {
        eprintln!("collector API on {}", api.endpoint);
    }
    let outcome = collector::run(&settings, bound, stop)?;
    print!("{}", outcome.table());
    Ok(())
}
