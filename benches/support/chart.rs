//! Charts the benchmarks draw of what they measured: self-contained SVG (no script, no font
//! or file fetched), written next to the tables they print. Shared by the benchmarks that
//! BENCHMARKS.md shows as charts.
//!
//! `IDEM_BENCH_CHARTS=docs/bench` writes them where BENCHMARKS.md shows them; by default they
//! go to `target/bench-charts/`, so an exploratory run does not touch the committed ones.

#![allow(dead_code)] // each benchmark draws some of the kinds

use std::fmt::Write;
use std::path::PathBuf;

/// Colours that stay apart for the colour-blind (Okabe–Ito), then greys.
const PALETTE: [&str; 10] = [
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
    "#999999", "#666666",
];

const PLOT_LEFT: f64 = 70.0;
const PLOT_TOP: f64 = 50.0;
const PLOT_WIDTH: f64 = 400.0;
const PLOT_HEIGHT: f64 = 260.0;
const LEGEND_LEFT: f64 = PLOT_LEFT + PLOT_WIDTH + 25.0;

/// Wide enough for the legend's longest name and the title (about 7 px a character).
fn width(title: &str, names: &[&str]) -> f64 {
    let longest = names.iter().map(|n| n.chars().count()).max().unwrap_or(0) as f64;
    (LEGEND_LEFT + 30.0 + longest * 7.0).max(PLOT_LEFT + title.chars().count() as f64 * 8.5 + 20.0)
}

/// One line of a [`lines`] chart: a name and a y value per x category (`None`: not measured).
pub struct Series {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

/// One bar of a [`bars`] chart: the median and the range of a ratio over the rounds.
pub struct Bar {
    pub median: f64,
    pub low: f64,
    pub high: f64,
}

impl Bar {
    /// The bar of the ratios measured in each round (at least one).
    pub fn of(ratios: Vec<f64>) -> Bar {
        let (low, high) = ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), &r| (l.min(r), h.max(r)));
        Bar {
            median: median(ratios),
            low,
            high,
        }
    }
}

/// The median of `values` (at least one): the middle one, or the mean of the middle two.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// `count` of `what`, for an axis: "1 task", "8 tasks".
pub fn count(count: usize, what: &str) -> String {
    if count == 1 {
        format!("1 {what}")
    } else {
        format!("{count} {what}s")
    }
}

/// A group of [`bars`]: a category and one bar per series (`None`: not measured).
pub struct Group {
    pub name: String,
    pub bars: Vec<Option<Bar>>,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" upper bound for an axis that must reach `max`, and its tick step.
fn axis(max: f64) -> (f64, f64) {
    if max <= 0.0 || !max.is_finite() {
        return (1.0, 0.25);
    }
    let magnitude = 10f64.powf(max.log10().floor());
    for step in [0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0] {
        let step = step * magnitude;
        let top = (max / step).ceil() * step;
        if top / step <= 6.0 {
            return (top, step);
        }
    }
    (max, max / 5.0)
}

fn number(value: f64) -> String {
    if value >= 10.0 || value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

fn frame(svg: &mut String, size: (f64, f64), title: &str, y_label: &str, top: f64, step: f64) {
    let (width, height) = size;
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{PLOT_LEFT}" y="24" font-size="15" font-weight="bold">{}</text>
<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>
"##,
        escape(title),
        PLOT_TOP + PLOT_HEIGHT / 2.0,
        PLOT_TOP + PLOT_HEIGHT / 2.0,
        escape(y_label),
    );
    let mut tick = 0.0;
    while tick <= top + step / 2.0 {
        let y = PLOT_TOP + PLOT_HEIGHT - tick / top * PLOT_HEIGHT;
        let _ = writeln!(
            svg,
            r##"<line x1="{PLOT_LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#dddddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            PLOT_LEFT + PLOT_WIDTH,
            PLOT_LEFT - 6.0,
            y + 4.0,
            number(tick),
        );
        tick += step;
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{PLOT_LEFT}" y1="{PLOT_TOP}" x2="{PLOT_LEFT}" y2="{}" stroke="#333333"/><line x1="{PLOT_LEFT}" y1="{}" x2="{}" y2="{}" stroke="#333333"/>"##,
        PLOT_TOP + PLOT_HEIGHT,
        PLOT_TOP + PLOT_HEIGHT,
        PLOT_LEFT + PLOT_WIDTH,
        PLOT_TOP + PLOT_HEIGHT,
    );
}

fn legend(svg: &mut String, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        let y = PLOT_TOP + 8.0 + i as f64 * 20.0;
        let colour = PALETTE[i % PALETTE.len()];
        let _ = writeln!(
            svg,
            r##"<rect x="{LEGEND_LEFT}" y="{:.1}" width="14" height="10" fill="{colour}"/><text x="{}" y="{:.1}">{}</text>"##,
            y - 9.0,
            LEGEND_LEFT + 20.0,
            y,
            escape(name),
        );
    }
}

fn height(entries: usize) -> f64 {
    (PLOT_TOP + PLOT_HEIGHT + 50.0).max(PLOT_TOP + 20.0 + entries as f64 * 20.0)
}

/// A line chart: y against categorical x (`x_names`), a line per series.
pub fn lines(
    title: &str,
    x_label: &str,
    y_label: &str,
    x_names: &[String],
    series: &[Series],
) -> String {
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0f64, |m, &v| m.max(v));
    let (top, step) = axis(max);
    let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
    let size = (width(title, &names), height(series.len()));
    let mut svg = String::new();
    frame(&mut svg, size, title, y_label, top, step);
    let x_of = |i: usize| PLOT_LEFT + PLOT_WIDTH * (i as f64 + 0.5) / x_names.len().max(1) as f64;
    for (i, name) in x_names.iter().enumerate() {
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"##,
            x_of(i),
            PLOT_TOP + PLOT_HEIGHT + 18.0,
            escape(name),
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" text-anchor="middle">{}</text>"##,
        PLOT_LEFT + PLOT_WIDTH / 2.0,
        PLOT_TOP + PLOT_HEIGHT + 38.0,
        escape(x_label),
    );
    for (k, s) in series.iter().enumerate() {
        let colour = PALETTE[k % PALETTE.len()];
        let points: Vec<(f64, f64)> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                v.map(|v| (x_of(i), PLOT_TOP + PLOT_HEIGHT - v / top * PLOT_HEIGHT))
            })
            .collect();
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        // Past the palette, lines repeat its colours dashed.
        let dash = if k >= PALETTE.len() {
            r#" stroke-dasharray="6,3""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r##"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>"##,
            path.join(" "),
        );
        for (x, y) in points {
            let _ = writeln!(
                svg,
                r##"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{colour}"/>"##
            );
        }
    }
    legend(&mut svg, &names);
    svg.push_str("</svg>\n");
    svg
}

/// A grouped bar chart of ratios: a bar per series in each group, its whisker the range over
/// the rounds, and a dashed line at `reference` (1.0: as fast as the baseline).
pub fn bars(
    title: &str,
    y_label: &str,
    series: &[&str],
    groups: &[Group],
    reference: f64,
) -> String {
    let max = groups
        .iter()
        .flat_map(|g| g.bars.iter().flatten())
        .fold(reference, |m, b| m.max(b.high));
    let (top, step) = axis(max);
    let size = (width(title, series), height(series.len()));
    let mut svg = String::new();
    frame(&mut svg, size, title, y_label, top, step);
    let group_width = PLOT_WIDTH / groups.len().max(1) as f64;
    let bar_width = (group_width * 0.8) / series.len().max(1) as f64;
    let y_of = |v: f64| PLOT_TOP + PLOT_HEIGHT - v / top * PLOT_HEIGHT;
    for (g, group) in groups.iter().enumerate() {
        let left = PLOT_LEFT + g as f64 * group_width + group_width * 0.1;
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"##,
            PLOT_LEFT + (g as f64 + 0.5) * group_width,
            PLOT_TOP + PLOT_HEIGHT + 18.0,
            escape(&group.name),
        );
        for (k, bar) in group.bars.iter().enumerate() {
            let Some(bar) = bar else { continue };
            let colour = PALETTE[k % PALETTE.len()];
            let x = left + k as f64 * bar_width;
            let y = y_of(bar.median);
            let middle = x + bar_width / 2.0;
            let _ = writeln!(
                svg,
                r##"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{colour}"/><line x1="{middle:.1}" y1="{:.1}" x2="{middle:.1}" y2="{:.1}" stroke="#333333"/>"##,
                (bar_width - 2.0).max(1.0),
                PLOT_TOP + PLOT_HEIGHT - y,
                y_of(bar.low),
                y_of(bar.high),
            );
            // The median over the bar, where there is room for it.
            if bar_width >= 26.0 {
                let _ = writeln!(
                    svg,
                    r##"<text x="{middle:.1}" y="{:.1}" text-anchor="middle" font-size="10">{:.2}</text>"##,
                    y_of(bar.high) - 4.0,
                    bar.median,
                );
            }
        }
    }
    let y = y_of(reference);
    let _ = writeln!(
        svg,
        r##"<line x1="{PLOT_LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#333333" stroke-dasharray="5,4"/>"##,
        PLOT_LEFT + PLOT_WIDTH,
    );
    legend(&mut svg, series);
    svg.push_str("</svg>\n");
    svg
}

/// Writes `svg` as `<name>.svg` into `IDEM_BENCH_CHARTS` (default `target/bench-charts`) and
/// says where.
pub fn write(name: &str, svg: &str) {
    let dir = std::env::var("IDEM_BENCH_CHARTS")
        .ok()
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-charts"));
    let path = dir.join(format!("{name}.svg"));
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, svg)) {
        Ok(()) => eprintln!("chart: {}", path.display()),
        Err(e) => eprintln!("chart {}: not written: {e}", path.display()),
    }
}

/// A name fit for a file: lowercase ASCII letters and digits, the rest dashes.
pub fn slug(text: &str) -> String {
    let mut slug = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    slug.trim_matches('-').to_owned()
}
