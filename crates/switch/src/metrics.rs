//! A Prometheus text endpoint on loopback: `GET /metrics` returns every counter, totals and
//! per worker, encoded by `prometheus-client` (names, help, escaping and the `_total`
//! suffix as Prometheus expects them). One small thread, one connection at a time; nothing
//! on the packet path: a scrape reads the counters the workers publish.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, prometheus_text};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Registry;
use stateplane_runtime::RunHandle;
use stateplane_runtime::{Counter, Stats};
use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

/// Parses and checks the address: loopback only, so that nothing is exposed beyond the host.
/// A loopback address and port given to `flag` (an endpoint with no authentication), e.g.
/// `example`.
pub fn parse_addr(flag: &str, text: &str, example: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = text.parse().map_err(|_| {
        format!("{flag}: '{text}' is not an address and port; write it like {example}")
    })?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{flag}: {addr} is not a loopback address; the endpoint serves on 127.0.0.1 or [::1] only"
        ));
    }
    Ok(addr)
}

/// What one scrape reads: the run's shared counters, read as they are at that moment.
struct Scrape {
    handle: Arc<RunHandle>,
    drop_names: &'static [&'static str],
    ports: Vec<String>,
}

impl fmt::Debug for Scrape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scrape")
            .field("ports", &self.ports)
            .finish()
    }
}

/// A counter's series, each its labels and its value.
type Series = Vec<(Vec<(&'static str, String)>, u64)>;

/// Encodes one counter family (the exposition names it `NAME_total`).
fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, series: Series) -> fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in &series {
        ConstCounter::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let total = self.handle.totals();
        // Entry 0 is the dispatcher, whose drops are in the totals but belong to no worker.
        let per_worker: Vec<Stats> = (self.handle.stats.iter().skip(1))
            .map(|s| s.snapshot())
            .collect();
        for c in Counter::ALL {
            let mut series: Series = vec![(Vec::new(), total.get(c))];
            for (w, s) in per_worker.iter().enumerate() {
                series.push((vec![("worker", w.to_string())], s.get(c)));
            }
            counter(
                &mut e,
                &format!("stateplane_{}", c.name()),
                c.help(),
                series,
            )?;
        }
        let by_reason = |counts: Vec<(&'static str, u64)>| -> Series {
            (counts.into_iter())
                .map(|(reason, v)| (vec![("reason", reason.to_string())], v))
                .collect()
        };
        let drops = by_reason(total.drops_by_reason(self.drop_names));
        counter(
            &mut e,
            "stateplane_drops",
            "Packets dropped, by reason",
            drops,
        )?;
        let malformed = by_reason(total.malformed_by_reason());
        let help = "Packets that failed to parse, by reason";
        counter(&mut e, "stateplane_malformed_packets", help, malformed)?;
        // Live ports: the kernel's and the rings' own counts (drops before any worker saw them).
        let port_totals = self.handle.port_totals();
        if let Some(first) = port_totals.first() {
            for (i, (name, _)) in first.named().iter().enumerate() {
                let series = (port_totals.iter().enumerate())
                    .map(|(p, counts)| {
                        let port = self
                            .ports
                            .get(p)
                            .map_or_else(|| p.to_string(), Clone::clone);
                        (vec![("port", port)], counts.named()[i].1)
                    })
                    .collect();
                let help = "A live port's own count (its socket, ring or the kernel)";
                counter(&mut e, &format!("stateplane_port_{name}"), help, series)?;
            }
        }
        Ok(())
    }
}

fn render(registry: &Registry) -> String {
    let mut body = String::new();
    // Writing into a String fails only if a collector does, and ours do not.
    let _ = prometheus_text::encode(&mut body, registry);
    body
}

/// Starts serving on a thread that lives as long as the process (so the totals stay
/// readable after the run, see `--hold-metrics`).
pub fn serve(
    addr: SocketAddr,
    handle: Arc<RunHandle>,
    drop_names: &'static [&'static str],
    ports: Vec<String>,
) -> Result<(), String> {
    let listener =
        TcpListener::bind(addr).map_err(|e| format!("--metrics: cannot listen on {addr}: {e}"))?;
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape {
        handle,
        drop_names,
        ports,
    }));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let mut req = [0u8; 1024];
            let n = stream.read(&mut req).unwrap_or(0);
            let ok = req[..n].starts_with(b"GET /metrics");
            let (status, body) = if ok {
                ("200 OK", render(&registry))
            } else {
                ("404 Not Found", "try /metrics\n".to_owned())
            };
            let _ = write!(
                stream,
                "HTTP/1.0 {status}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\r\n{body}",
                prometheus_text::CONTENT_TYPE,
                body.len()
            );
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_runtime::DropReason;

    #[test]
    fn a_scrape_has_every_counter_as_a_total_and_per_worker_and_drops_by_reason() {
        let handle = Arc::new(RunHandle::new(2));
        let mut worker1 = Stats::default();
        worker1.add(Counter::RxPackets, 7);
        worker1.drops[DropReason::program(0).0 as usize] = 3;
        handle.stats[2].publish(&worker1);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Scrape {
            handle,
            drop_names: &["say \"no\""],
            ports: Vec::new(),
        }));
        let body = render(&registry);
        for line in [
            "# HELP stateplane_rx_packets_total Packets received by the workers",
            "# TYPE stateplane_rx_packets_total counter",
            "stateplane_rx_packets_total 7",
            "stateplane_rx_packets_total{worker=\"0\"} 0",
            "stateplane_rx_packets_total{worker=\"1\"} 7",
            "stateplane_bursts_total{worker=\"1\"} 0",
            // A program's reason is a label value, escaped as Prometheus reads it.
            "stateplane_drops_total{reason=\"say \\\"no\\\"\"} 3",
        ] {
            assert!(body.lines().any(|l| l == line), "{line} missing:\n{body}");
        }
        assert!(!body.contains("stateplane_port_"), "no live ports: {body}");
    }
}
