//! `stateplane report`: one HTML page of what a folder of results holds, to look at rather
//! than open file by file: the runs' summaries (`run --summary-file`) with their rates side
//! by side in a chart, each CSV as a table of its first rows, each SVG or PNG chart in
//! place, and every other file by name and size. The page is self-contained (nothing
//! beside it, nothing fetched) and checks itself as it loads: every section shows its
//! content and every picture drew, said at its top and in `body[data-checks]`.
//!
//! Must never: leave a file of the folder out without saying so.

use crate::summary_output::CliResult;
use base64::Engine;
use serde_json::Value;
use stateplane_bench::chart::{self, Panel};
use std::fmt::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct ReportArgs {
    /// The folder whose results the page gathers (the demo's: out).
    #[arg(default_value = "out")]
    pub dir: PathBuf,
    /// The page to write (default: report.html in the folder).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Rows of each CSV shown (the page says how many the file has).
    #[arg(long, default_value_t = 20)]
    pub rows: usize,
}

pub fn main(a: ReportArgs) -> CliResult<()> {
    if a.rows == 0 {
        return Err("--rows 0 would show no CSV's rows: give at least 1 (default 20)".into());
    }
    let output = a
        .output
        .clone()
        .unwrap_or_else(|| a.dir.join("report.html"));
    let page = build(&a.dir, &output, a.rows)?;
    std::fs::write(&output, &page.html)
        .map_err(|e| format!("--output {}: {e}", output.display()))?;
    println!(
        "{}: {} ({}, {}, {}; {} named); open it in a browser",
        output.display(),
        count(page.sections, "section"),
        count(page.summaries, "run summary"),
        count(page.tables, "table"),
        count(page.charts, "chart"),
        count(page.others, "other file or folder"),
    );
    Ok(())
}

/// A page, and what it holds.
struct Page {
    html: String,
    sections: usize,
    summaries: usize,
    tables: usize,
    charts: usize,
    others: usize,
}

/// What one file of the folder gives the page.
enum Found {
    Summary(Value),
    Csv(String),
    Svg(String),
    Png(Vec<u8>),
    Other(u64),
    Folder,
}

fn read(path: &Path) -> CliResult<Found> {
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    let ext = (path.extension().and_then(|e| e.to_str()))
        .unwrap_or("")
        .to_ascii_lowercase();
    Ok(match ext.as_str() {
        "json" => {
            let text = std::fs::read_to_string(path).map_err(fail)?;
            match serde_json::from_str::<Value>(&text) {
                // A run's summary: its counters are what the page shows of it.
                Ok(v) if v.get("counters").is_some_and(Value::is_object) => Found::Summary(v),
                _ => Found::Other(text.len() as u64),
            }
        }
        "csv" => Found::Csv(std::fs::read_to_string(path).map_err(fail)?),
        "svg" => Found::Svg(std::fs::read_to_string(path).map_err(fail)?),
        "png" => Found::Png(std::fs::read(path).map_err(fail)?),
        _ => Found::Other(std::fs::metadata(path).map_err(fail)?.len()),
    })
}

fn build(dir: &Path, output: &Path, rows: usize) -> CliResult<Page> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        format!(
            "{}: {e} (give the folder of results: the demo writes out/)",
            dir.display()
        )
    })?;
    let mut paths: Vec<PathBuf> = (entries.flatten())
        .map(|e| e.path())
        .filter(|p| !same_file(p, output))
        .collect();
    paths.sort();
    let mut found = Vec::new();
    for path in paths {
        let mut name = (path.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if path.is_dir() {
            // Not gathered (the page is one folder's), but named.
            name.push('/');
            found.push((name, Found::Folder));
        } else {
            found.push((name, read(&path)?));
        }
    }
    let summaries: Vec<(&str, &Value)> = (found.iter())
        .filter_map(|(name, f)| match f {
            Found::Summary(v) => Some((name.as_str(), v)),
            _ => None,
        })
        .collect();
    let mut body = String::new();
    let mut ids = Vec::new();
    let mut section = |id: String, title: &str, content: &str| {
        let _ = write!(
            body,
            "<section id=\"{id}\">\n<h2>{}</h2>\n{content}</section>\n",
            esc(title)
        );
        ids.push(id);
    };
    let rates: Vec<(String, f64)> = (summaries.iter())
        .filter_map(|(name, v)| Some((run_name(name, v), v.get("mpps")?.as_f64()?)))
        .collect();
    let mut charts = 0;
    if !rates.is_empty() {
        let panel = Panel {
            title: "Mpps, each run's packets over its wall time".into(),
            unit: "Mpps".into(),
            bars: rates,
        };
        let subtitle = format!("from the run summaries in {}", dir.display());
        let drawn = chart::svg("Packets a second", &subtitle, &[panel])?;
        section("rates".into(), "The runs side by side", &inline_svg(&drawn));
        charts += 1;
    }
    for (name, summary) in &summaries {
        section(
            anchor(name),
            &format!("{} ({name})", run_name(name, summary)),
            &summary_tables(summary),
        );
    }
    let (mut tables, mut others_list) = (0, Vec::new());
    for (name, f) in &found {
        match f {
            Found::Summary(_) => {}
            Found::Csv(text) => {
                section(anchor(name), name, &csv_table(text, rows));
                tables += 1;
            }
            Found::Svg(text) => {
                section(anchor(name), name, &inline_svg(text));
                charts += 1;
            }
            Found::Png(bytes) => {
                let data = base64::engine::general_purpose::STANDARD.encode(bytes);
                let img = format!(
                    "<img alt=\"{}\" src=\"data:image/png;base64,{data}\">\n",
                    esc(name)
                );
                section(anchor(name), name, &img);
                charts += 1;
            }
            Found::Other(bytes) => others_list.push((name.clone(), human_bytes(*bytes))),
            Found::Folder => others_list.push((name.clone(), "a folder, not gathered".into())),
        }
    }
    let others = others_list.len();
    if !others_list.is_empty() {
        let rows: Vec<Vec<String>> = (others_list.into_iter())
            .map(|(name, size)| vec![name, size])
            .collect();
        section(
            "files".into(),
            "Other files of the folder",
            &table(&["file", "size"], &rows),
        );
    }
    if ids.is_empty() {
        return Err(format!(
            "{}: no results to gather (run summaries from `run --summary-file`, CSV, SVG or PNG)",
            dir.display()
        ));
    }
    let sections = ids.len();
    let expected = serde_json::json!({ "sections": ids }).to_string();
    let html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>stateplane report: {dir}</title>\n<style>{STYLE}</style>\n</head>\n\
         <body data-checks=\"pending\">\n<h1>stateplane report: {dir}</h1>\n\
         <p id=\"checks\">The page is checking itself.</p>\n{body}\
         <script type=\"application/json\" id=\"expected\">{expected}</script>\n\
         <script>{CHECKS}</script>\n</body>\n</html>\n",
        dir = esc(&dir.display().to_string()),
        expected = expected.replace("</", "<\\/"),
    );
    Ok(Page {
        html,
        sections,
        summaries: summaries.len(),
        tables,
        charts,
        others,
    })
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A run's name on the page: its program, and the file's stem when that says more.
fn run_name(file: &str, summary: &Value) -> String {
    let stem = file.trim_end_matches(".json").trim_end_matches(".summary");
    match summary.get("program").and_then(Value::as_str) {
        Some(program) if program != stem => format!("{stem}: {program}"),
        Some(program) => program.to_string(),
        None => stem.to_string(),
    }
}

/// A summary's figures: the headline (packets, rate, memory), then its drops and its
/// ports.
fn summary_tables(v: &Value) -> String {
    let count = |pointer: &str| v.pointer(pointer).map(cell);
    let bytes = |pointer: &str| v.pointer(pointer)?.as_u64().map(human_bytes);
    let headline = [
        ("program", count("/program")),
        ("workers", count("/workers")),
        ("packets in", count("/counters/rx_packets")),
        ("packets out", count("/counters/tx_packets")),
        ("dropped", count("/counters/dropped")),
        ("malformed", count("/counters/malformed")),
        ("to the control plane", count("/counters/to_control")),
        ("Mpps", count("/mpps")),
        ("wall seconds", count("/wall_seconds")),
        ("memory claimed", bytes("/memory/claimed_bytes")),
        ("resident at peak", bytes("/memory/resident_peak_bytes")),
    ];
    let rows: Vec<Vec<String>> = (headline.into_iter())
        .filter_map(|(what, value)| Some(vec![what.to_string(), value?]))
        .collect();
    let mut html = table(&["", "value"], &rows);
    for (key, title) in [
        ("drops", "drops by reason"),
        ("malformed", "malformed by reason"),
    ] {
        let Some(reasons) = v.get(key).and_then(Value::as_object) else {
            continue;
        };
        if reasons.is_empty() {
            continue;
        }
        let rows: Vec<Vec<String>> = (reasons.iter())
            .map(|(reason, n)| vec![reason.clone(), cell(n)])
            .collect();
        html += &table(&[title, "packets"], &rows);
    }
    if let Some(ports) = v.get("ports").and_then(Value::as_array) {
        let rows: Vec<Vec<String>> = (ports.iter())
            .map(|p| {
                let field = |k: &str| p.get(k).map_or(String::new(), cell);
                vec![field("port"), field("tx_packets"), field("tx_bytes")]
            })
            .collect();
        if !rows.is_empty() {
            html += &table(&["port", "packets sent", "bytes sent"], &rows);
        }
    }
    html
}

/// A summary's value as the page shows it: counts grouped, rates with three decimals,
/// text as it is.
fn cell(value: &Value) -> String {
    match value {
        Value::Number(n) => match n.as_u64() {
            Some(count) => group(count),
            None => format!("{:.3}", n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A CSV's first `rows` rows under its header, and how many it has.
fn csv_table(text: &str, rows: usize) -> String {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let Some(header) = lines.next() else {
        return "<p class=\"empty\">An empty file.</p>\n".into();
    };
    let header: Vec<&str> = header.split(',').collect();
    let all: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    if all.is_empty() {
        return format!(
            "<p class=\"empty\">A header and no rows: {}.</p>\n",
            esc(&header.join(", "))
        );
    }
    let shown = &all[..all.len().min(rows)];
    let html = if all.len() > shown.len() {
        format!(
            "<p>The first {} of its {} rows.</p>\n",
            shown.len(),
            group(all.len() as u64)
        )
    } else {
        format!("<p>{} rows.</p>\n", all.len())
    };
    // A wide CSV scrolls in its own box, not the page.
    html + "<div class=\"wide\">\n" + &table(&header, shown) + "</div>\n"
}

fn table<S: AsRef<str>>(header: &[S], rows: &[Vec<String>]) -> String {
    let mut html = String::from("<table>\n<tr>");
    for h in header {
        let _ = write!(html, "<th>{}</th>", esc(h.as_ref()));
    }
    html += "</tr>\n";
    for row in rows {
        html += "<tr>";
        for cell in row {
            let _ = write!(html, "<td>{}</td>", esc(cell));
        }
        html += "</tr>\n";
    }
    html + "</table>\n"
}

/// An SVG document as an element of the page (its XML prologue dropped).
fn inline_svg(text: &str) -> String {
    let start = text.find("<svg").unwrap_or(0);
    format!("<figure>{}</figure>\n", &text[start..])
}

fn anchor(name: &str) -> String {
    let id: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("file-{id}")
}

fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `n` things, in the plural when not one.
fn count(n: usize, one: &str) -> String {
    let many = match one {
        "run summary" => "run summaries".to_string(),
        "other file or folder" => "other files and folders".to_string(),
        _ => format!("{one}s"),
    };
    format!("{n} {}", if n == 1 { one } else { &many })
}

fn group(n: u64) -> String {
    indicatif::HumanCount(n).to_string()
}

fn human_bytes(n: u64) -> String {
    indicatif::HumanBytes(n).to_string()
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em;max-width:70em;color:#222}\
h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}\
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ddd;padding:.25em .6em;\
text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}\
#checks{padding:.4em .8em;background:#fff6d5}body[data-checks=passed] #checks{background:#e3f4e1}\
body[data-checks=failed] #checks{background:#fbe0e0}figure{margin:.6em 0}.wide{overflow-x:auto}";

/// The page's own checks, run once everything has loaded.
const CHECKS: &str = r#"
window.addEventListener('load', function () {
  var expected = JSON.parse(document.getElementById('expected').textContent).sections;
  var problems = [];
  expected.forEach(function (id) {
    var s = document.getElementById(id);
    if (!s) { problems.push('section ' + id + ' is missing'); return; }
    if (!s.querySelector('table, svg, img, .empty')) { problems.push(id + ' shows nothing'); }
  });
  Array.prototype.forEach.call(document.images, function (img) {
    if (!img.complete || img.naturalWidth === 0) { problems.push('picture ' + img.alt + ' did not load'); }
  });
  Array.prototype.forEach.call(document.querySelectorAll('svg'), function (svg) {
    var box = svg.getBBox();
    if (!(box.width > 0 && box.height > 0)) { problems.push('a chart drew nothing'); }
  });
  Array.prototype.forEach.call(document.querySelectorAll('table'), function (t) {
    if (t.rows.length < 2) { problems.push('a table has no rows'); }
  });
  var said = document.getElementById('checks');
  if (problems.length) {
    document.body.dataset.checks = 'failed';
    said.textContent = 'The page checked itself and found: ' + problems.join('; ');
  } else {
    document.body.dataset.checks = 'passed';
    said.textContent = 'The page checked itself: ' + expected.length +
      ' sections, each with its content, every chart drawn.';
  }
});
"#;
