//! Horizontal bar charts as standalone SVG: one or more panels of labelled bars.

pub struct Panel {
    pub title: String,
    pub unit: String,
    pub bars: Vec<(String, f64)>,
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Panels stacked top to bottom, each scaled to its own largest bar.
pub fn bars(title: &str, subtitle: &str, panels: &[Panel]) -> String {
    // The label column fits the longest label (about 7 px per character at 12 px).
    let longest = panels
        .iter()
        .flat_map(|p| p.bars.iter().map(|b| b.0.chars().count()))
        .max()
        .unwrap_or(0);
    let left = (longest as f64 * 7.0 + 16.0).max(90.0);
    let (width, bar, gap) = (520.0, 24.0, 10.0);
    let panel_height = |p: &Panel| 26.0 + p.bars.len() as f64 * (bar + gap) + 8.0;
    let height = 44.0 + panels.iter().map(panel_height).sum::<f64>();
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"8\" y=\"18\" font-size=\"13\">{}</text>\n<text x=\"8\" y=\"34\" font-size=\"9\">{}</text>\n",
        left + width + 110.0,
        escape(title),
        escape(subtitle)
    );
    let mut y = 44.0;
    for p in panels {
        svg.push_str(&format!(
            "<text x=\"8\" y=\"{:.0}\" font-weight=\"bold\">{}</text>\n",
            y + 16.0,
            escape(&p.title)
        ));
        y += 26.0;
        let max = p.bars.iter().map(|b| b.1).fold(f64::MIN_POSITIVE, f64::max);
        for (label, value) in &p.bars {
            // A value that is not a number (nothing measured) gets no bar.
            let (w, shown) = if value.is_finite() {
                (width * value / max, format!("{value:.2} {}", p.unit))
            } else {
                (0.0, "none".to_string())
            };
            svg.push_str(&format!(
                "<text x=\"8\" y=\"{:.0}\">{}</text><rect x=\"{left}\" y=\"{y:.0}\" width=\"{w:.1}\" height=\"{bar}\" fill=\"#3b6ea5\"/>\
                 <text x=\"{:.1}\" y=\"{:.0}\">{}</text>\n",
                y + bar * 0.65,
                escape(label),
                left + w + 6.0,
                y + bar * 0.65,
                escape(&shown)
            ));
            y += bar + gap;
        }
        y += 8.0;
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value that is not a number draws no bar and says so, and leaves the other bars'
    /// scale alone: no "NaN" reaches the SVG, whose attributes must be numbers.
    #[test]
    fn a_missing_value_draws_no_bar() {
        let panel = Panel {
            title: "t".into(),
            unit: "ms".into(),
            bars: vec![
                ("measured".into(), 2.0),
                ("never happened".into(), f64::NAN),
            ],
        };
        let svg = bars("title", "subtitle", &[panel]);
        assert!(!svg.contains("NaN"), "{svg}");
        assert!(
            svg.contains(">none</text>") && svg.contains(">2.00 ms</text>"),
            "{svg}"
        );
    }
}
