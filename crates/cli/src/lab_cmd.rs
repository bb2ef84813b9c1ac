//! `stateplane lab`: hosts and switches in network namespaces on this machine.

use crate::summary_output::CliResult;
use stateplane_lab::Topology;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct LabArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Create the lab's namespaces, links and addresses, and start its switches.
    Up {
        /// The topology file (TOML; topologies/ has examples, docs/lab.md the format).
        topology: PathBuf,
    },
    /// Stop the lab's switches and remove everything it created (also after a crash).
    Down {
        /// The topology file (TOML; topologies/ has examples, docs/lab.md the format).
        topology: PathBuf,
    },
    /// Show each node: namespace, switch process, interfaces and addresses.
    Status {
        /// The topology file (TOML; topologies/ has examples, docs/lab.md the format).
        topology: PathBuf,
    },
    /// Benchmark live ports on a line lab of its own: Linux bridge vs AF_PACKET vs AF_XDP.
    Bench(stateplane_bench::lab_bench::LabBenchArgs),
    /// Measure how long a TCP connection stalls when the switch carrying it dies, on a lab
    /// of its own (topologies/dual-nat.toml): replicated firewalls and NATs at several
    /// leases, unreplicated, and stateless forward.
    BenchFailover(stateplane_bench::lab_replication::FailoverBenchArgs),
    /// Measure what replicated state adds to a packet's round trip (ping), on a lab of its
    /// own (topologies/dual-nat.toml): firewall, nat and counter, unreplicated and
    /// replicated.
    BenchLatency(stateplane_bench::lab_replication::LatencyBenchArgs),
    /// Run a command in a node's namespace, e.g. `lab exec line.toml h1 ping 198.18.0.2`.
    Exec {
        /// The topology file (TOML; topologies/ has examples, docs/lab.md the format).
        topology: PathBuf,
        /// The host or switch whose namespace runs it, as the topology names it.
        node: String,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<String>,
    },
}

pub fn main(args: LabArgs) -> CliResult<()> {
    match args.action {
        Action::Up { topology } => {
            let t = Topology::load(&topology)?;
            let exe = std::env::current_exe()
                .map_err(|e| format!("finding the stateplane binary: {e}"))?;
            stateplane_lab::up(&t, &exe)?;
            print_status(&t)?;
            Ok(())
        }
        Action::Down { topology } => {
            let t = Topology::load(&topology)?;
            let removed = stateplane_lab::down(&t.name)?;
            println!("lab {}: removed {} namespace(s)", t.name, removed.len());
            Ok(())
        }
        Action::Status { topology } => print_status(&Topology::load(&topology)?),
        Action::Bench(args) => stateplane_bench::lab_bench::main(args),
        Action::BenchFailover(args) => stateplane_bench::lab_replication::main(args),
        Action::BenchLatency(args) => stateplane_bench::lab_replication::main_latency(args),
        Action::Exec {
            topology,
            node,
            command,
        } => {
            let code = stateplane_lab::exec(&Topology::load(&topology)?, &node, &command)?;
            if code == 0 {
                Ok(())
            } else {
                std::process::exit(code)
            }
        }
    }
}

fn print_status(t: &Topology) -> CliResult<()> {
    let nodes = stateplane_lab::status(t)?;
    println!("lab {}:", t.name);
    for n in &nodes {
        let state = match (n.present, n.kind, n.process) {
            (false, _, _) => "absent".to_owned(),
            (true, "switch", Some(pid)) => format!("running (pid {pid})"),
            (true, "switch", None) => "stopped".to_owned(),
            (true, _, _) => "up".to_owned(),
        };
        println!(
            "  {:<8} {:<10} {:<16} {}",
            n.node, n.kind, n.namespace, state
        );
        for i in &n.interfaces {
            println!("             {i}");
        }
    }
    Ok(())
}
