//! `stateplane chart`: draws a CSV that a script wrote (scripts/compare-dpdk.sh) as the
//! same bar charts the experiments draw: a panel for each value of the first column, in
//! the order met, and a bar for each of its rows, labelled by the columns between the
//! first and the last, its value the last column (whose header names the unit).
//!
//! Must never: draw a row it could not read; a cell that is not a number is an error
//! naming its line.

use crate::BenchResult;
use crate::chart::Panel;
use crate::results::ResultFiles;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ChartArgs {
    /// The CSV to draw: a header line, then rows of at least three columns.
    #[arg(long = "from")]
    pub from: PathBuf,
    /// The chart's title.
    #[arg(long, default_value = "")]
    pub title: String,
    /// A line under the title (what was measured, on what).
    #[arg(long, default_value = "")]
    pub subtitle: String,
    /// The values' unit (default: the last column's header).
    #[arg(long)]
    pub unit: Option<String>,
    #[command(flatten)]
    pub files: ResultFiles,
}

/// The panels of a CSV's text.
pub fn panels(text: &str) -> Result<Vec<Panel>, String> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, header) = lines
        .next()
        .ok_or("it is empty: a header line, then rows")?;
    let unit = header.rsplit(',').next().unwrap_or_default().to_string();
    let mut panels: Vec<Panel> = Vec::new();
    for (n, line) in lines {
        let cells: Vec<&str> = line.split(',').collect();
        let [panel, label @ .., value] = cells.as_slice() else {
            unreachable!("split yields at least one cell")
        };
        if label.is_empty() {
            return Err(format!(
                "line {}: a panel, a label and a value are needed",
                n + 1
            ));
        }
        let value: f64 = (value.trim().parse())
            .map_err(|_| format!("line {}: `{value}` is not a number", n + 1))?;
        let bar = (label.join(", "), value);
        match panels.iter_mut().find(|p| p.title == *panel) {
            Some(p) => p.bars.push(bar),
            None => panels.push(Panel {
                title: panel.to_string(),
                unit: unit.clone(),
                bars: vec![bar],
            }),
        }
    }
    Ok(panels)
}

pub fn main(a: ChartArgs) -> BenchResult<()> {
    if !a.files.wants_chart() {
        return Err("give --svg FILE or --png FILE: the chart to draw".into());
    }
    let text = std::fs::read_to_string(&a.from)
        .map_err(|e| format!("--from {}: {e}", a.from.display()))?;
    let mut panels = panels(&text).map_err(|e| format!("--from {}: {e}", a.from.display()))?;
    if let Some(unit) = &a.unit {
        panels.iter_mut().for_each(|p| p.unit = unit.clone());
    }
    a.files.write_chart(&a.title, &a.subtitle, &panels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_become_bars_in_panels_by_their_first_column() {
        let p =
            panels("experiment,system,mode,mpps\nfwd,a,io,4.5\nacl,b,x,2\nfwd,c,y,1e1\n").unwrap();
        let shape: Vec<(&str, Vec<(String, f64)>)> = p
            .iter()
            .map(|p| (p.title.as_str(), p.bars.clone()))
            .collect();
        assert_eq!(
            shape,
            [
                ("fwd", vec![("a, io".into(), 4.5), ("c, y".into(), 10.0)]),
                ("acl", vec![("b, x".into(), 2.0)]),
            ]
        );
        assert_eq!(p[0].unit, "mpps");
    }

    #[test]
    fn what_cannot_be_drawn_is_named_by_line() {
        assert_eq!(
            panels("").unwrap_err(),
            "it is empty: a header line, then rows"
        );
        assert_eq!(
            panels("a,b,c\nx,y,fast\n").unwrap_err(),
            "line 2: `fast` is not a number"
        );
        assert_eq!(
            panels("a,b\nx,1\n").unwrap_err(),
            "line 2: a panel, a label and a value are needed"
        );
    }
}
