//! The cost of a UDP message on loopback, sent one per send and in runs that the kernel
//! cuts apart (`stateplane_io::udp_socket`, what `stateplane flows --ipfix-gso` does): a receiver
//! thread drains a socket of its own while the sender times itself.
//!
//!     cargo run --release -p stateplane-io --example udp_gso [MESSAGES] [SIZE]

use stateplane_io::udp_socket as udp;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let messages = args.next().transpose().map_err(invalid)?.unwrap_or(20_000);
    let size = args.next().transpose().map_err(invalid)?.unwrap_or(1_384);
    if !(1..=u16::MAX as usize).contains(&size) {
        return Err(invalid("SIZE must be 1 to 65535 bytes"));
    }
    println!("{messages} messages of {size} bytes to a socket on loopback, median of 5");
    for run in [1, 32] {
        let mut times: Vec<Duration> = (0..5)
            .map(|_| send(messages, size, run))
            .collect::<std::io::Result<_>>()?;
        times.sort();
        let per_message = times[2].as_secs_f64() * 1e6 / messages as f64;
        println!("  {run:>2} per send: {per_message:.2} us per message");
    }
    Ok(())
}

fn invalid(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("usage: udp_gso [MESSAGES] [SIZE]: {e}"),
    )
}

/// Sends `messages` of `size` bytes, `run` per send, while a thread drains the receiver.
fn send(messages: usize, size: usize, run: usize) -> std::io::Result<Duration> {
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    rx.set_read_timeout(Some(Duration::from_millis(200)))?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    tx.connect(rx.local_addr()?)?;
    if run > 1 {
        udp::set_segment_size(&tx, size as u16)?;
    }
    let drain = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        while rx.recv(&mut buf).is_ok() {}
    });
    let payload = vec![7u8; size * run];
    let start = Instant::now();
    for _ in 0..messages.div_ceil(run) {
        tx.send(&payload)?;
    }
    let took = start.elapsed();
    let _ = drain.join();
    Ok(took)
}
