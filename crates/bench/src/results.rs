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

/// An experiment's table for people: a header, then a line per result, each column as
/// wide as its widest cell, two spaces apart; the names first, lined up to the left, then
/// the figures, lined up to the right.
pub struct Table {
    columns: Vec<&'static str>,
    names: usize,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table whose columns are `names` then `figures` (their headers).
    pub fn new(names: &[&'static str], figures: &[&'static str]) -> Table {
        Table {
            columns: [names, figures].concat(),
            names: names.len(),
            rows: Vec::new(),
        }
    }

    /// Adds a line: a cell per column, formatted by the caller.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Prints the table on standard output.
    pub fn print(&self) {
        print!("{self}");
    }
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let header: Vec<String> = self.columns.iter().map(|c| c.to_string()).collect();
        let lines = std::iter::once(&header).chain(&self.rows);
        let mut widths: Vec<usize> = vec![0; self.columns.len()];
        for line in lines.clone() {
            for (w, cell) in widths.iter_mut().zip(line) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for line in lines {
            let mut text = String::new();
            for (i, (cell, width)) in line.iter().zip(&widths).enumerate() {
                let pad = " ".repeat(width - cell.chars().count());
                let gap = if i == 0 { "" } else { "  " };
                if i < self.names {
                    text += &format!("{gap}{cell}{pad}");
                } else {
                    text += &format!("{gap}{pad}{cell}");
                }
            }
            writeln!(f, "{}", text.trim_end())?;
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
    fn a_table_lines_names_up_left_and_figures_right_under_their_headers() {
        let mut table = Table::new(&["program"], &["Mpps"]);
        table.row(vec!["forward".into(), "43.54".into()]);
        table.row(vec!["l2".into(), "9.1".into()]);
        assert_eq!(
            table.to_string(),
            "program   Mpps\nforward  43.54\nl2         9.1\n"
        );
    }

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
