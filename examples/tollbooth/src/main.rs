//! The `tollbooth` binary: Stateplane's command line with one more program. Everything the
//! `stateplane` binary does works here (`run`, `lab`, `ctl`, `gen`, the benchmarks), and
//! `tollbooth run tollbooth ...` runs this crate's program.

use std::process::ExitCode;

fn main() -> ExitCode {
    let about = "a byte budget per source address and interval (an example of your own program)";
    if let Err(e) = stateplane_programs::register("tollbooth", about, tollbooth::build) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    stateplane::main()
}
