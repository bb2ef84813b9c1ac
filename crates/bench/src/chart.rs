//! Horizontal bar charts, drawn by `plotters` as SVG or PNG: panels stacked top to bottom,
//! each with its own scale, a bar per label and the value written after it.
//!
//! The text is set in DejaVu Sans, built into the binary (`fonts/`, Bitstream Vera
//! licence beside it), so that a chart looks the same on a machine with no fonts.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, register_font};
use std::path::Path;
use std::sync::OnceLock;

/// One panel: bars of `(label, value)` in `unit`, in the order given (top first). A value
/// that is not a number (nothing measured) draws no bar and reads "none".
#[derive(Debug)]
pub struct Panel {
    pub title: String,
    pub unit: String,
    pub bars: Vec<(String, f64)>,
}

const WIDTH: u32 = 780;
const HEADER: u32 = 52;
const BAR: u32 = 26;
const FONT: &str = "sans-serif";
const BLUE: RGBColor = RGBColor(59, 110, 165);
const GREY: RGBColor = RGBColor(90, 90, 90);

/// Registers the built-in font once per process.
fn font() -> Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let bytes: &'static [u8] = include_bytes!("../fonts/DejaVuSans.ttf");
            register_font(FONT, FontStyle::Normal, bytes)
                .map_err(|_| "the chart font built into the binary did not load".to_string())
        })
        .clone()
}

fn panel_height(p: &Panel) -> u32 {
    64 + p.bars.len() as u32 * BAR
}

/// The chart's width and height in pixels.
fn size(panels: &[Panel]) -> (u32, u32) {
    (WIDTH, HEADER + panels.iter().map(panel_height).sum::<u32>())
}

/// Writes the chart to `path`: PNG if its name ends in `.png`, SVG otherwise.
pub fn write(path: &Path, title: &str, subtitle: &str, panels: &[Panel]) -> Result<(), String> {
    font()?;
    let png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if png {
        let area = BitMapBackend::new(path, size(panels)).into_drawing_area();
        draw(&area, title, subtitle, panels).map_err(|e| e.to_string())?;
    } else {
        std::fs::write(path, svg(title, subtitle, panels)?).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The chart as SVG text (what `write` puts in a `.svg` file; `stateplane report` puts it
/// inline in a page).
pub fn svg(title: &str, subtitle: &str, panels: &[Panel]) -> Result<String, String> {
    font()?;
    let mut svg = String::new();
    let area = SVGBackend::with_string(&mut svg, size(panels)).into_drawing_area();
    draw(&area, title, subtitle, panels).map_err(|e| e.to_string())?;
    drop(area);
    Ok(svg)
}

type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
    panels: &[Panel],
) -> Drawn<DB> {
    root.fill(&WHITE)?;
    root.draw(&Text::new(title, (10, 8), (FONT, 16).into_font()))?;
    let small = (FONT, 11).into_font().color(&GREY);
    root.draw(&Text::new(subtitle, (10, 30), small))?;
    // The label column fits the longest label (about 7 px a character at 11 px).
    let longest = (panels.iter())
        .flat_map(|p| p.bars.iter().map(|b| b.0.chars().count()))
        .max()
        .unwrap_or(0);
    let label_width = (longest as u32 * 7 + 16).max(90);
    let (_, mut rest) = root.split_vertically(HEADER);
    for p in panels {
        let (area, below) = rest.split_vertically(panel_height(p));
        rest = below;
        draw_panel(&area, p, label_width)?;
    }
    root.present()
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
    label_width: u32,
) -> Drawn<DB> {
    let n = p.bars.len();
    let Some(last) = n.checked_sub(1) else {
        return area.draw(&Text::new(p.title.as_str(), (10, 4), (FONT, 13)));
    };
    let max = (p.bars.iter().map(|b| b.1))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, (FONT, 13))
        .margin_right(110)
        .x_label_area_size(32)
        .y_label_area_size(label_width)
        .build_cartesian_2d(0.0..max * 1.02, (0..last).into_segmented())?;
    // Bar i is drawn in segment last - i, so that the first bar is the top one.
    let row = |i: usize| last - i;
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(s) => {
            (p.bars.get(last - s).map(|b| b.0.clone())).unwrap_or_default()
        }
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&label)
        .x_labels(5)
        .x_desc(p.unit.as_str())
        .label_style((FONT, 11))
        .draw()?;
    let measured = p.bars.iter().enumerate().filter(|(_, b)| b.1.is_finite());
    chart.draw_series(measured.map(|(i, b)| {
        let top = SegmentValue::Exact(row(i));
        let bottom = SegmentValue::Exact(row(i) + 1);
        let mut bar = Rectangle::new([(0.0, top), (b.1, bottom)], BLUE.filled());
        bar.set_margin(3, 3, 0, 0);
        bar
    }))?;
    let value_style =
        TextStyle::from((FONT, 11).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    chart.draw_series(p.bars.iter().enumerate().map(|(i, b)| {
        let (x, shown) = if b.1.is_finite() {
            (b.1, format!("{:.2} {}", b.1, p.unit))
        } else {
            (0.0, "none".to_string())
        };
        EmptyElement::at((x, SegmentValue::CenterOf(row(i))))
            + Text::new(shown, (5, 0), value_style.clone())
    }))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panels() -> Vec<Panel> {
        vec![
            Panel {
                title: "Mpps per core".into(),
                unit: "Mpps".into(),
                bars: vec![
                    ("forward <fast> & simple".into(), 30.25),
                    ("never happened".into(), f64::NAN),
                ],
            },
            Panel {
                title: "empty".into(),
                unit: "µs".into(),
                bars: Vec::new(),
            },
        ]
    }

    /// A value that is not a number draws no bar and says so: no "NaN" reaches the SVG,
    /// whose attributes must be numbers; labels are escaped; the first bar is on top.
    #[test]
    fn an_svg_has_every_label_and_value_and_a_missing_value_draws_no_bar() {
        let dir = std::env::temp_dir().join(format!("sp-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.svg");
        write(&path, "title", "input: a subtitle", &panels()).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(!svg.contains("NaN"), "{svg}");
        for text in [
            "30.25 Mpps",
            "none",
            "forward &lt;fast&gt; &amp; simple",
            "empty",
        ] {
            assert!(svg.contains(text), "{text} missing: {svg}");
        }
        let (first, second) = (
            svg.find("forward &lt;").unwrap(),
            svg.find("never").unwrap(),
        );
        let y = |at: usize| -> f64 {
            let tag = &svg[svg[..at].rfind("<text").unwrap()..at];
            let y = &tag[tag.find(" y=\"").unwrap() + 4..];
            y[..y.find('"').unwrap()].parse().unwrap()
        };
        assert!(
            y(first) < y(second),
            "the first bar is drawn above the second"
        );
        let png = dir.join("chart.png");
        write(&png, "title", "subtitle", &panels()).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG file");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
