//! A Prometheus text endpoint on loopback: `GET /metrics` returns every counter, totals and
//! per worker. One small thread, one connection at a time; nothing on the packet path.

use stateplane_runtime::RunHandle;
use stateplane_runtime::{Counter, Stats};
use std::fmt::Write as _;
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

fn render(handle: &RunHandle, drop_names: &'static [&'static str], ports: &[String]) -> String {
    let mut out = String::new();
    let total = handle.totals();
    // Entry 0 is the dispatcher, whose drops are in the totals but belong to no worker.
    let per_worker: Vec<Stats> = handle.stats[1..].iter().map(|s| s.snapshot()).collect();
    for c in Counter::ALL {
        let _ = writeln!(out, "# TYPE stateplane_{} counter", c.name());
        let _ = writeln!(out, "stateplane_{} {}", c.name(), total.get(c));
        for (w, s) in per_worker.iter().enumerate() {
            let _ = writeln!(
                out,
                "stateplane_{}{{worker=\"{w}\"}} {}",
                c.name(),
                s.get(c)
            );
        }
    }
    let _ = writeln!(out, "# TYPE stateplane_drops counter");
    for (reason, v) in total.drops_by_reason(drop_names) {
        let _ = writeln!(out, "stateplane_drops{{reason=\"{reason}\"}} {v}");
    }
    let _ = writeln!(out, "# TYPE stateplane_malformed_packets counter");
    for (reason, v) in total.malformed_by_reason() {
        let _ = writeln!(
            out,
            "stateplane_malformed_packets{{reason=\"{reason}\"}} {v}"
        );
    }
    // Live ports: the kernel's and the rings' own counts (drops before any worker saw them).
    let port_totals = handle.port_totals();
    if let Some(first) = port_totals.first() {
        for (i, (name, _)) in first.named().iter().enumerate() {
            let _ = writeln!(out, "# TYPE stateplane_port_{name} counter");
            for (p, counts) in port_totals.iter().enumerate() {
                let port = ports.get(p).map_or_else(|| p.to_string(), Clone::clone);
                let value = counts.named()[i].1;
                let _ = writeln!(out, "stateplane_port_{name}{{port=\"{port}\"}} {value}");
            }
        }
    }
    out
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
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let mut req = [0u8; 1024];
            let n = stream.read(&mut req).unwrap_or(0);
            let ok = req[..n].starts_with(b"GET /metrics");
            let (status, body) = if ok {
                ("200 OK", render(&handle, drop_names, &ports))
            } else {
                ("404 Not Found", "try /metrics\n".to_owned())
            };
            let _ = write!(
                stream,
                "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok(())
}
