//! What every command prints at its end: a run's summary as a table or JSON, kept apart
//! from flow records when those go to standard output; and the commands' error type.

/// The error type of every command: a message a user can act on.
pub type CliResult<T> = Result<T, String>;

/// Prints a run's summary, a table or JSON, where it does not mix with flow records.
pub(crate) fn print_summary(outcome: &stateplane_switch::Outcome, json: bool) -> CliResult<()> {
    let text = if json {
        serde_json::to_string_pretty(&outcome.to_json()).map_err(|e| e.to_string())? + "\n"
    } else {
        outcome.table()
    };
    emit(&text, outcome.records_to_stdout);
    Ok(())
}

/// Prints a summary to standard output, or to standard error when flow records are going
/// to standard output.
pub(crate) fn emit(text: &str, records_to_stdout: bool) {
    if records_to_stdout {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
}

/// Ends a run over capture files that a signal stopped: says so (and the run's error, if
/// any) after its summary, and exits with the status a shell gives a command the signal
/// ended (130 for SIGINT), as Unix tools end.
pub fn end_interrupted(signal: i32, error: Option<String>) -> ! {
    eprintln!(
        "interrupted by signal {signal}: what was read so far went through and is in the \
         summary; the rest of the input was not read"
    );
    if let Some(e) = error {
        eprintln!("error: {e}");
    }
    std::process::exit(128 + signal)
}
