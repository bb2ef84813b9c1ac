//! The program run by its own binary over a generated trace, as a user would run it.

use std::process::Command;

fn tollbooth() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollbooth"))
}

#[test]
fn tollbooth_runs_from_a_config_and_counts_its_drops() {
    // Removed when dropped, also when the test fails.
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let trace = dir.join("in.pcap");
    let generated = tollbooth()
        .args(["gen", "internet", "--packets", "20000", "--seed", "3", "-o"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let config = dir.join("tollbooth.toml");
    std::fs::write(
        &config,
        "[program]\nname = \"tollbooth\"\n[program.tollbooth]\nbudget = 20000\ninterval_ms = 10\n\
         [[port]]\nname = \"in\"\nrx = \"in.pcap\"\n[[port]]\nname = \"out\"\ntx = \"out.pcap\"\n",
    )
    .unwrap();
    let run = tollbooth()
        .args(["run", "--json", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let over = v["drops"]["over_budget"].as_u64().unwrap_or(0);
    let out = v["counters"]["tx_packets"].as_u64().unwrap_or(0);
    assert!(over > 0, "the heavy sources went over budget: {v}");
    assert_eq!(
        over + out,
        20_000,
        "every packet forwarded or dropped over budget: {v}"
    );
    // The program is listed among the others, and a typo in its settings names the field.
    let bad = dir.join("bad.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&bad, text.replace("budget = 20000", "budget = 0")).unwrap();
    let refused = tollbooth()
        .args(["run", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("program.tollbooth.budget"), "{said}");
}
