//! Helpers the `stateplane` binary's integration tests share (each test file uses some).
#![allow(dead_code, clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `stateplane` binary under test.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stateplane"))
}

/// A path in this test process's own temporary folder, which goes when the process exits,
/// whether its tests passed or failed (the harness ends by `exit`, which runs the handler
/// `tmp` registers). The first call also removes the folders of test processes that ended
/// without exiting (killed): their traces take gigabytes.
pub fn tmp(name: &str) -> PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        remove_folders_of_ended_runs();
        // SAFETY: `atexit` only records the address of a function with the C ABI that
        // takes nothing; the function touches no state that exit has torn down (it reads
        // the process id and removes a folder).
        let registered = unsafe { libc::atexit(remove_this_runs_folder) };
        assert_eq!(registered, 0, "atexit refused the clean-up handler");
    });
    let dir = this_runs_folder();
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A folder of its own for `name` in this process's temporary folder (gone at exit, as
/// `tmp`'s files).
pub fn tmp_dir(name: &str) -> PathBuf {
    let dir = tmp(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn this_runs_folder() -> PathBuf {
    std::env::temp_dir().join(format!("stateplane-test-{}", std::process::id()))
}

extern "C" fn remove_this_runs_folder() {
    let _ = std::fs::remove_dir_all(this_runs_folder());
}

fn remove_folders_of_ended_runs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = (name.to_str())
            .and_then(|n| n.strip_prefix("stateplane-test-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Standard error of a `stateplane` run with `args` that must have failed, and said
/// `message` there.
pub fn refused(args: &[&str], message: &str) -> String {
    let out = bin().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(err.contains(message), "{args:?}: {err}");
    err
}

/// Standard output of a command that must have succeeded (else both outputs, in the
/// failure).
pub fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A loopback port nothing listens on now, for a server of the test's own.
pub fn free_port() -> u16 {
    stateplane_lab::free_loopback_port().unwrap()
}

/// A TCP client (198.18.0.1) and its server (198.19.0.1) as the frames each sends carry
/// them: MACs and addresses swapped between the two.
pub fn client_and_server() -> (stateplane_gen::build::Hosts, stateplane_gen::build::Hosts) {
    let client = stateplane_gen::build::Hosts {
        src_mac: stateplane_wire::ethernet::MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: stateplane_wire::ethernet::MacAddr([2, 0, 0, 0, 0, 2]),
        vlan: 0,
        src: std::net::Ipv4Addr::new(198, 18, 0, 1).into(),
        dst: std::net::Ipv4Addr::new(198, 19, 0, 1).into(),
        ttl: 64,
    };
    let server = stateplane_gen::build::Hosts {
        src_mac: client.dst_mac,
        dst_mac: client.src_mac,
        src: client.dst,
        dst: client.src,
        ..client
    };
    (client, server)
}

/// `stateplane ARGS` reading `input` on standard input (which a test can hold back), sent
/// SIGINT once half of it is in: its output, after checking it ended with status 130 and
/// said it was interrupted. Input goes on coming after the signal, as a reader sees a
/// stop on its next read, until the command stops taking it.
pub fn interrupted_mid_input(args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = bin()
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let half = input.len() / 2;
    stdin.write_all(&input[..half]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let pid = child.id().to_string();
    let killed = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(killed.success());
    for piece in input[half..].chunks(1 << 16) {
        if stdin.write_all(piece).is_err() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted by signal 2"), "{err}");
    out
}

/// A tool the test command installs; its absence is a failure, not a skip.
pub fn tool(name: &str) -> Command {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "{name} is not installed: run scripts/test.sh, which installs it (apt-get install tshark tcpdump)"
    );
    Command::new(name)
}

/// Writes `frames` (time, bytes, length on the wire) to a capture file at `path`.
pub fn write_capture(
    path: &std::path::Path,
    frames: &[(u64, Vec<u8>, u32)],
    format: stateplane_io::CaptureFormat,
) {
    let file = std::fs::File::create(path).unwrap();
    let mut w = stateplane_io::CaptureWriter::new(file, format).unwrap();
    for (ts, data, orig_len) in frames {
        w.write(*ts, data, *orig_len).unwrap();
    }
    w.flush().unwrap();
}

/// What `promtool check metrics` says of `text` (nothing when it finds no fault).
pub fn promtool_check(text: &str) -> String {
    use std::io::Write;
    let mut child = tool("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.trim().is_empty() {
        String::new()
    } else {
        format!("exit {:?}: {said}", out.status.code())
    }
}

/// The sum of a family's samples in Prometheus text.
pub fn sum_of(text: &str, family: &str) -> u64 {
    (text.lines())
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The metric families the Grafana dashboard (`docs/grafana/stateplane.json`) queries, with
/// `prefix` (`stateplane_port_`), or all of them; each panel must have a query.
pub fn dashboard_families(prefix: &str) -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/grafana/stateplane.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut families = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "a panel with no query: {panel}");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            let names = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
            for name in names.filter(|n| n.starts_with("stateplane_")) {
                if name.starts_with(prefix) && !families.iter().any(|f| f == name) {
                    families.push(name.to_string());
                }
            }
        }
    }
    families
}

/// Checks a scrape's text: Prometheus' own checker takes it as it is (names, `_total`,
/// help lines, types), and it has samples of every family of the Grafana dashboard that
/// `shown` picks (those this scrape's run serves: a run over files has no ports).
pub fn assert_scrape_sound(text: &str, shown: impl Fn(&str) -> bool) {
    let checked = promtool_check(text);
    assert!(checked.is_empty(), "promtool check metrics: {checked}");
    let served = |family: &str| {
        (text.lines()).any(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
    };
    let missing: Vec<String> = (dashboard_families("stateplane_").into_iter())
        .filter(|f| shown(f) && !served(f))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries {missing:?}: {text}"
    );
}

/// The whole HTTP answer to `GET /metrics` at `addr` (headers and text), or `None` while
/// nothing listens there.
pub fn get_metrics(addr: impl std::net::ToSocketAddrs) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    Some(body)
}

/// Runs `command`, a run that serves metrics on loopback `port` and holds them after it
/// ends (`--hold-metrics`); scrapes until `done` holds of an answer, then once more (what
/// `done` waits for, such as a file the run writes at its end, may have come after the
/// answer it was asked of); stops the run and gives that last scrape's text.
pub fn metrics_of_held_run(
    command: &mut Command,
    port: u16,
    done: impl Fn(&str) -> bool,
) -> String {
    let mut child = command.stdout(std::process::Stdio::null()).spawn().unwrap();
    let body = scrape_until(port, done);
    let body = get_metrics(("127.0.0.1", port)).unwrap_or(body);
    let _ = child.kill();
    let _ = child.wait();
    assert!(body.starts_with("HTTP/1.0 200 OK"), "{body}");
    match body.split_once("\r\n\r\n") {
        Some((_, text)) => text.to_owned(),
        None => panic!("no end of headers: {body}"),
    }
}

/// Scrapes a run's metrics on loopback `port` until `done` holds of the answer (bounded:
/// 200 tries 50 ms apart, about 10 s), and gives the last answer whatever it holds.
pub fn scrape_until(port: u16, done: impl Fn(&str) -> bool) -> String {
    let mut body = String::new();
    for _ in 0..200 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        if let Some(answer) = get_metrics(("127.0.0.1", port)) {
            body = answer;
            if done(&body) {
                break;
            }
        }
    }
    body
}
