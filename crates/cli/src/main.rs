//! The `stateplane` binary: the command line of the `stateplane` library.

fn main() -> std::process::ExitCode {
    stateplane::main()
}
