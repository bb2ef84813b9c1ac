//! `stateplane bench-replication-store`: the rate of the replication store's sequenced
//! write, one flow per call, through the link a worker uses (`stateplane_stores`), with
//! `depth` calls in each round trip (1: no pipelining), for the memory store and a real
//! redis-server on loopback (one of the run's own unless `--redis` names one). This is the
//! rate replication's figures are read against: a flow's write waits for its round trip.
//! Beside it, `redis-batched`: the same writes with up to 128 flows in one function call
//! (`stateplane_v2_batch`, what a switch's link sends).
//! With `--tls`, the run's server also listens with TLS (certificates of a throwaway CA),
//! and both are measured again over it (`redis-tls`, `redis-batched-tls`): what TLS costs,
//! against the same server in the same run.
//!
//! The run checks its work before it prints: every write is answered as written, with
//! its sequence number, and afterwards the store holds each flow's last write.

use crate::BenchResult;
use crate::results::{Csv, ResultFiles, Table};
use crate::statistics::{median, percentile};
use stateplane_replication::store::StoreConfig;
use stateplane_replication::{Holder, Reply, Request};
use stateplane_stores::memory::MemoryStore;
use stateplane_stores::redis::{RedisConfig, RedisStore};
use stateplane_stores::redis_client::{self, RedisTls, TlsFiles};
use stateplane_stores::{StoreLink, Value};
use stateplane_switch::units::bounded;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct BenchReplicationStoreArgs {
    /// Writes timed at each depth.
    #[arg(long, default_value_t = 100_000)]
    pub writes: usize,
    /// Flows written in turn (each write is to the next flow: one flow per call).
    #[arg(long, default_value_t = 4_096)]
    pub flows: u32,
    /// Comma-separated calls per round trip.
    #[arg(long, default_value = "1,16,256,4096")]
    pub depths: String,
    /// Bytes of each flow's state.
    #[arg(long, default_value_t = 32)]
    pub value_bytes: usize,
    /// Repeat each measurement and report the median.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// A Redis server to measure (default: one started for the run on a free loopback port);
    /// any store URL `[replication]` takes (docs/cli.md).
    #[arg(long)]
    pub redis: Option<String>,
    /// With a `rediss://` `--redis`: the certificate (PEM) of the CA that signed the
    /// server's; without it, the system's roots.
    #[arg(long)]
    pub redis_ca: Option<std::path::PathBuf>,
    /// With a `rediss://` `--redis`: this side's certificate (PEM), for a server that asks
    /// its clients for one.
    #[arg(long)]
    pub redis_cert: Option<std::path::PathBuf>,
    /// The key of `--redis-cert` (PEM).
    #[arg(long)]
    pub redis_key: Option<std::path::PathBuf>,
    /// Also measure the run's own server over TLS (a port of its own, a throwaway CA's
    /// certificates), beside it in plain text.
    #[arg(long)]
    pub tls: bool,
    #[command(flatten)]
    pub files: ResultFiles,
}

const HOLDER: Holder = Holder {
    switch: 1,
    incarnation: 0,
};
const LEASE_NS: u64 = 60_000_000_000;

struct Measured {
    store: &'static str,
    depth: usize,
    writes_per_s: f64,
    round_trip_p50_us: f64,
    round_trip_p99_us: f64,
}

/// Sends `requests` and waits for as many answers (10 s at most).
fn round_trip(
    link: &mut dyn StoreLink<u32>,
    requests: &mut Vec<Request<u32, Value>>,
    answers: &mut Vec<Reply<u32, Value>>,
) -> BenchResult<()> {
    let want = answers.len() + requests.len();
    link.send(HOLDER, requests);
    let start = Instant::now();
    while answers.len() < want {
        link.receive(answers);
        if start.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "the store answered {} of {} requests within 10 s: {:?}",
                answers.len(),
                want,
                link.counters()
            ));
        }
        // Spins through a round trip's time, then waits as an idle worker does, on the
        // link's socket, leaving the cores to the store.
        if answers.len() < want
            && start.elapsed() > Duration::from_micros(100)
            && let Some(fd) = link.wake_fd()
        {
            let _ = stateplane_io::live::poll_readable(&[fd], 10);
        }
    }
    Ok(())
}

/// Takes every flow's lease (not timed); returns the epochs.
fn acquire_all(link: &mut dyn StoreLink<u32>, flows: u32) -> BenchResult<Vec<u64>> {
    let mut epochs = vec![0; flows as usize];
    let mut answers = Vec::new();
    for chunk in (0..flows).collect::<Vec<_>>().chunks(4_096) {
        let mut requests: Vec<_> = (chunk.iter())
            .map(|&key| Request::Acquire {
                key,
                lease_ns: LEASE_NS,
                nonce: 1,
            })
            .collect();
        answers.clear();
        round_trip(link, &mut requests, &mut answers)?;
        for a in &answers {
            match a {
                Reply::Granted { key, epoch, .. } => epochs[*key as usize] = *epoch,
                other => return Err(format!("taking the leases: {other:?}")),
            }
        }
    }
    Ok(epochs)
}

/// Times `writes` sequenced writes, `depth` a round trip; each checked as answered.
fn timed_writes(
    link: &mut dyn StoreLink<u32>,
    epochs: &[u64],
    seqs: &mut [u64],
    writes: usize,
    depth: usize,
    value: &[u8],
) -> BenchResult<(f64, Vec<u64>)> {
    let flows = epochs.len();
    let mut next_flow = 0;
    let mut answers = Vec::with_capacity(depth);
    let mut requests = Vec::with_capacity(depth);
    let mut round_trips_ns = Vec::new();
    let start = Instant::now();
    let mut done = 0;
    while done < writes {
        requests.clear();
        for _ in 0..depth.min(writes - done) {
            let key = next_flow;
            next_flow = (next_flow + 1) % flows;
            seqs[key] += 1;
            requests.push(Request::Write {
                key: key as u32,
                epoch: epochs[key],
                seq: seqs[key],
                value: value.to_vec(),
                lease_ns: LEASE_NS,
                // A state that times out, as a connection's does: the longer path.
                keep_ns: 120_000_000_000,
                alias: None,
            });
        }
        let n = requests.len();
        answers.clear();
        let t = Instant::now();
        round_trip(link, &mut requests, &mut answers)?;
        round_trips_ns.push(t.elapsed().as_nanos() as u64);
        for a in &answers {
            match a {
                Reply::Written { key, seq, .. } if *seq == seqs[*key as usize] => {}
                other => return Err(format!("a write was answered {other:?}")),
            }
        }
        done += n;
    }
    Ok((
        writes as f64 / start.elapsed().as_secs_f64(),
        round_trips_ns,
    ))
}

pub fn main(a: BenchReplicationStoreArgs) -> BenchResult<()> {
    let repeat = bounded("--repeat", a.repeat, 1, 101)?;
    let writes = bounded("--writes", a.writes, 1, 100_000_000)?;
    let flows = bounded("--flows", a.flows as usize, 1, 16_777_216)? as u32;
    let value_bytes = bounded("--value-bytes", a.value_bytes, 0, 65_536)?;
    let depths = (a.depths.split(','))
        .map(|d| {
            d.trim()
                .parse::<usize>()
                .ok()
                .filter(|d| (1..=65_536).contains(d))
                .ok_or_else(|| format!("--depths: '{d}' is not a depth from 1 to 65536"))
        })
        .collect::<BenchResult<Vec<_>>>()?;
    let files = TlsFiles::of_flags(
        a.redis_ca.as_deref(),
        a.redis_cert.as_deref(),
        a.redis_key.as_deref(),
    );
    let tls = RedisTls::load_for(a.redis.as_deref(), "--redis", files)?;
    if a.tls && a.redis.is_some() {
        return Err(
            "--tls: it measures the run's own server over TLS; with --redis, \
                    give a rediss:// URL instead"
                .into(),
        );
    }
    // The throwaway CA's files live as long as the run.
    let pki = match a.tls {
        true => Some(stateplane_test_pki::TestPki::new(
            "bench-replication-store",
        )?),
        false => None,
    };
    let (own_server, url) = match &a.redis {
        Some(url) => (None, url.clone()),
        None => {
            let port = stateplane_lab::free_loopback_port()?;
            let server = match &pki {
                Some(pki) => {
                    let tls_port = stateplane_lab::free_loopback_port()?;
                    stateplane_lab::RedisServer::start_tls(
                        port,
                        tls_port,
                        &pki.server_files(),
                        false,
                    )?
                }
                None => stateplane_lab::RedisServer::start(port, false)?,
            };
            let url = server.url();
            (Some(server), url)
        }
    };
    // The store at `url` one flow a call (`batch`), and batched.
    let stores = |url: &str, tls: Option<RedisTls>, name: &str| -> BenchResult<_> {
        let config = |batch, kind: &str| RedisConfig {
            prefix: format!("stateplane:{kind}:{}", std::process::id()),
            batch,
            tls: tls.clone(),
            ca_setting: "--redis-ca",
            ..RedisConfig::new(url)
        };
        Ok((
            RedisStore::connect(config(1, name))?,
            RedisStore::connect(config(
                RedisConfig::new(url).batch,
                &format!("{name}-batched"),
            ))?,
        ))
    };
    let (redis, batched) = stores(&url, tls, "bench")?;
    let over_tls = match (&pki, own_server.as_ref().and_then(|s| s.tls_url())) {
        (Some(pki), Some(tls_url)) => {
            let ca = pki.path("ca.pem");
            let tls = RedisTls::load_for(
                Some(&tls_url),
                "--tls",
                TlsFiles::of_flags(Some(&ca), None, None),
            )?;
            Some(stores(&tls_url, tls, "bench-tls")?)
        }
        _ => None,
    };
    let memory = MemoryStore::<u32>::new(StoreConfig::default());
    let value = vec![0xa5; value_bytes];
    let version = own_server
        .as_ref()
        .map(|s| s.cli(&["info", "server"]))
        .and_then(|info| {
            info.lines().find_map(|l| {
                l.strip_prefix("redis_version:")
                    .map(str::trim)
                    .map(String::from)
            })
        })
        .unwrap_or_else(|| "as named by --redis".into());
    eprintln!(
        "{writes} sequenced writes over {flows} flows ({value_bytes}-byte states) at depths {depths:?}, \
         median of {repeat}; Redis {version} at {}",
        redis_client::redacted(&url)
    );

    let mut links: Vec<(&'static str, Box<dyn StoreLink<u32>>)> = vec![
        ("memory", Box::new(memory.link())),
        ("redis", Box::new(redis.link::<u32>()?)),
        ("redis-batched", Box::new(batched.link::<u32>()?)),
    ];
    if let Some((redis, batched)) = &over_tls {
        links.push(("redis-tls", Box::new(redis.link::<u32>()?)));
        links.push(("redis-batched-tls", Box::new(batched.link::<u32>()?)));
    }
    let mut measured = Vec::new();
    for (store, link) in &mut links {
        let epochs = acquire_all(link.as_mut(), flows)?;
        let mut seqs = vec![0u64; flows as usize];
        for &depth in &depths {
            let mut rates = Vec::new();
            let mut trips = Vec::new();
            for _ in 0..repeat {
                let (rate, mut t) =
                    timed_writes(link.as_mut(), &epochs, &mut seqs, writes, depth, &value)?;
                rates.push(rate);
                trips.append(&mut t);
            }
            let p50 = percentile(&mut trips, 0.5) as f64 / 1e3;
            let p99 = percentile(&mut trips, 0.99) as f64 / 1e3;
            eprintln!(
                "  {store} depth {depth}: {:.0} writes/s",
                median(rates.clone())
            );
            measured.push(Measured {
                store,
                depth,
                writes_per_s: median(rates),
                round_trip_p50_us: p50,
                round_trip_p99_us: p99,
            });
        }
        // The work was done: the store holds every flow's last write (the holder asking
        // for its lease again is answered with the flow's state).
        for chunk in (0..flows).collect::<Vec<_>>().chunks(4_096) {
            let mut asks: Vec<_> = (chunk.iter())
                .map(|&key| Request::Acquire {
                    key,
                    lease_ns: LEASE_NS,
                    nonce: 2,
                })
                .collect();
            let mut answers = Vec::new();
            round_trip(link.as_mut(), &mut asks, &mut answers)?;
            for a in &answers {
                match a {
                    Reply::Granted {
                        key,
                        seq,
                        value: Some(v),
                        ..
                    } if *seq == seqs[*key as usize] && *v == value => {}
                    other => {
                        return Err(format!(
                            "the {store} store does not hold a flow's last write: {other:?}"
                        ));
                    }
                }
            }
        }
    }

    let mut table = Table::new(
        &["store"],
        &["depth", "writes/s", "round trip p50 us", "p99 us"],
    );
    let mut csv = Csv::new("store,depth,writes_per_s,round_trip_p50_us,round_trip_p99_us");
    for m in &measured {
        table.row(vec![
            m.store.into(),
            m.depth.to_string(),
            format!("{:.0}", m.writes_per_s),
            format!("{:.1}", m.round_trip_p50_us),
            format!("{:.1}", m.round_trip_p99_us),
        ]);
        csv.row(format_args!(
            "{},{},{:.0},{:.1},{:.1}",
            m.store, m.depth, m.writes_per_s, m.round_trip_p50_us, m.round_trip_p99_us
        ));
    }
    table.print();
    if let Some(path) = &a.files.csv {
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let panels: Vec<_> = [
            ("memory", "one flow per call"),
            ("redis", "one flow per call"),
            ("redis-batched", "up to 128 flows per call"),
            ("redis-tls", "one flow per call, over TLS"),
            ("redis-batched-tls", "up to 128 flows per call, over TLS"),
        ]
        .iter()
        .filter(|(store, _)| measured.iter().any(|m| m.store == *store))
        .map(|(store, calls)| crate::chart::Panel {
            title: format!("{store}: sequenced writes a second, {calls}"),
            unit: "writes/s".into(),
            bars: (measured.iter().filter(|m| m.store == *store))
                .map(|m| (format!("{} a round trip", m.depth), m.writes_per_s))
                .collect(),
        })
        .collect();
        let title = "The replication store's sequenced write, by calls per round trip";
        let subtitle = format!(
            "{writes} writes over {flows} flows, {value_bytes}-byte states, median of {repeat}; Redis {version}"
        );
        a.files.write_chart(title, &subtitle, &panels)?;
    }
    Ok(())
}

/// The Redis store at `url`'s sequenced writes a second, one flow per call, 256 calls a
/// round trip (its pipelined rate, where `bench-replication-store` shows it levels off),
/// over 4,096 flows of 32-byte states: what a replicated program's rate is read against.
pub fn one_flow_per_call(url: &str) -> BenchResult<f64> {
    let redis = RedisStore::connect(RedisConfig {
        prefix: format!("stateplane:bench-rate:{}", std::process::id()),
        batch: 1,
        ..RedisConfig::new(url)
    })?;
    let mut link = redis.link::<u32>()?;
    let epochs = acquire_all(&mut link, 4_096)?;
    let mut seqs = vec![0; 4_096];
    let (rate, _) = timed_writes(&mut link, &epochs, &mut seqs, 50_000, 256, &[0xa5; 32])?;
    Ok(rate)
}
