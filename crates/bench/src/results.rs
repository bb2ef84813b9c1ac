//! Where an experiment's results go beside its table: CSV for scripts and an SVG or PNG
//! chart for people, written the same way by every experiment (a failed write names the
//! flag and the file).

use crate::BenchResult;
use crate::chart::{self, Panel};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The files an experiment writes beside its table, named by the same two flags in every
/// experiment.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct ResultFiles {
    /// Also write the results as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Also draw them as an SVG chart.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Also draw them as a PNG chart.
    #[arg(long)]
    pub png: Option<PathBuf>,
}

impl ResultFiles {
    /// Whether a chart was asked for (so that its panels are made only then).
    pub fn wants_chart(&self) -> bool {
        self.svg.is_some() || self.png.is_some()
    }

    /// Draws `panels` under `title` and `subtitle` into each chart file asked for.
    pub fn write_chart(&self, title: &str, subtitle: &str, panels: &[Panel]) -> BenchResult<()> {
        for (flag, path) in [("--svg", &self.svg), ("--png", &self.png)] {
            if let Some(path) = path {
                chart::write(path, title, subtitle, panels)
                    .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
            }
        }
        Ok(())
    }
}

/// An experiment's CSV: a header line, then one line per result.
pub struct Csv(String);

impl Csv {
    /// A CSV whose first line is `header` (the column names, comma-separated).
    pub fn new(header: &str) -> Csv {
        Csv(format!("{header}\n"))
    }

    /// Adds one line (its fields formatted by the caller, comma-separated).
    pub fn row(&mut self, line: std::fmt::Arguments) {
        let _ = writeln!(self.0, "{line}");
    }

    /// Writes the CSV to `path` (given with `--csv`).
    pub fn write(&self, path: &Path) -> BenchResult<()> {
        std::fs::write(path, &self.0).map_err(|e| format!("--csv {}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_csv_has_its_header_then_one_line_per_row_and_a_failed_write_names_the_flag() {
        let mut csv = Csv::new("a,b");
        csv.row(format_args!("{},{:.2}", 1, 2.0));
        csv.row(format_args!("x,y"));
        assert_eq!(csv.0, "a,b\n1,2.00\nx,y\n");
        let err = csv.write(Path::new("/nonexistent/dir/x.csv")).err();
        assert!(err.is_some_and(|e| e.starts_with("--csv /nonexistent/dir/x.csv: ")));
    }
}
