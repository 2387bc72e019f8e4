//! The console's small charts: stacked bars drawn on the server as inline SVG, so a page
//! stays one response with no script and no dependency. Each bar is one bucket of a
//! group's [`GroupSeries`], its parts the records' statuses; hovering a bar names its time
//! and its counts.

use super::html::span;
use crate::inbox::{ActivityBucket, GroupSeries};
use std::fmt::Write;

/// A bar's width and the gap after it, and the chart's height, in pixels.
const BAR: u32 = 9;
const GAP: u32 = 2;
const HEIGHT: u32 = 36;

/// The statuses a bar stacks, from the bottom: the name a title gives each, and its color.
const PARTS: [(&str, &str); 4] = [
    ("done", "#5aa469"),
    ("in flight", "#9aa3b5"),
    ("failed", "#e0a000"),
    ("parked", "#b3261e"),
];

fn parts(bucket: &ActivityBucket) -> [u64; 4] {
    [
        bucket.succeeded,
        bucket.processing,
        bucket.failed,
        bucket.dead,
    ]
}

/// When bucket `index` of `count`, each `width_ms` long, was: `25m–20m ago`, `5m ago–now`.
fn when(index: usize, count: usize, width_ms: i64) -> String {
    let before = (count - index) as i64 * width_ms;
    let after = before - width_ms;
    if after == 0 {
        format!("{} ago–now", span(before))
    } else {
        format!("{}–{} ago", span(before), span(after))
    }
}

/// `series` as bars, one per bucket, the oldest on the left, scaled to its fullest bucket.
pub(crate) fn bars(series: &GroupSeries) -> String {
    let count = series.buckets.len();
    let width_ms = series.bucket.as_millis() as i64;
    let most = series
        .buckets
        .iter()
        .map(ActivityBucket::total)
        .max()
        .unwrap_or(0);
    let scale = most.max(1);
    let width = count as u32 * (BAR + GAP);
    let mut out = format!(
        "<svg class=\"chart\" width=\"{width}\" height=\"{}\" viewBox=\"0 0 {width} {}\" \
         role=\"img\" aria-label=\"records last touched, by {} bucket, the most {most}\">",
        HEIGHT + 1,
        HEIGHT + 1,
        span(width_ms),
    );
    for (index, bucket) in series.buckets.iter().enumerate() {
        let x = index as u32 * (BAR + GAP);
        let counts = parts(bucket);
        let mut said: Vec<String> = PARTS
            .iter()
            .zip(counts)
            .filter(|(_, n)| *n > 0)
            .map(|((name, _), n)| format!("{n} {name}"))
            .collect();
        if said.is_empty() {
            said.push("none".to_owned());
        }
        let _ = write!(
            out,
            "<g><title>{}: {}</title><rect x=\"{x}\" y=\"0\" width=\"{BAR}\" height=\"{HEIGHT}\" \
             fill=\"#f0f2f5\"/>",
            when(index, count, width_ms),
            said.join(", ")
        );
        // Each part's height rounds its share of the scale; a part that holds any record
        // shows at least one pixel.
        let mut top = HEIGHT as u64;
        for ((_, color), n) in PARTS.iter().zip(counts) {
            if n == 0 {
                continue;
            }
            let h = (n * u64::from(HEIGHT)).div_ceil(scale).max(1).min(top);
            top -= h;
            let _ = write!(
                out,
                "<rect x=\"{x}\" y=\"{top}\" width=\"{BAR}\" height=\"{h}\" fill=\"{color}\"/>"
            );
        }
        out.push_str("</g>");
    }
    let _ = write!(
        out,
        "<line x1=\"0\" y1=\"{HEIGHT}.5\" x2=\"{width}\" y2=\"{HEIGHT}.5\" stroke=\"#8a94a6\"/></svg>"
    );
    out
}

/// The colors' key, for under the charts.
pub(crate) fn legend() -> String {
    let mut out = String::from("<p class=\"legend\">");
    for (name, color) in PARTS {
        let _ = write!(
            out,
            "<svg width=\"10\" height=\"10\" aria-hidden=\"true\"><rect width=\"10\" height=\"10\" \
             fill=\"{color}\"/></svg> {name} "
        );
    }
    out.push_str("</p>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn bucket(succeeded: u64, processing: u64, failed: u64, dead: u64) -> ActivityBucket {
        ActivityBucket {
            processing,
            succeeded,
            failed,
            dead,
        }
    }

    #[test]
    fn bars_are_scaled_to_the_fullest_bucket_and_say_what_they_hold() {
        let series = GroupSeries {
            group: "billing".into(),
            bucket: Duration::from_secs(300),
            buckets: vec![bucket(0, 0, 0, 0), bucket(6, 0, 2, 0), bucket(1, 1, 0, 1)],
        };
        let svg = bars(&series);
        assert!(
            svg.starts_with("<svg class=\"chart\" width=\"33\""),
            "{svg}"
        );
        assert!(svg.contains("the most 8\""), "{svg}");
        // The oldest bucket is empty: its background only.
        assert!(
            svg.contains(
                "<g><title>15m–10m ago: none</title><rect x=\"0\" y=\"0\" width=\"9\" \
                 height=\"36\" fill=\"#f0f2f5\"/></g>"
            ),
            "{svg}"
        );
        // 6 of 8 done: 27 of 36 pixels from the bottom, then 2 failed: 9 above them.
        assert!(
            svg.contains("<title>10m–5m ago: 6 done, 2 failed</title>"),
            "{svg}"
        );
        assert!(
            svg.contains(
                "<rect x=\"11\" y=\"9\" width=\"9\" height=\"27\" fill=\"#5aa469\"/>\
                 <rect x=\"11\" y=\"0\" width=\"9\" height=\"9\" fill=\"#e0a000\"/>"
            ),
            "{svg}"
        );
        // The newest ends now; each of its parts shows.
        assert!(
            svg.contains("<title>5m ago–now: 1 done, 1 in flight, 1 parked</title>"),
            "{svg}"
        );
        assert!(svg.contains("height=\"5\" fill=\"#b3261e\""), "{svg}");
    }

    #[test]
    fn an_empty_series_draws_its_baseline() {
        let series = GroupSeries {
            group: "g".into(),
            bucket: Duration::from_secs(60),
            buckets: vec![ActivityBucket::default(); 2],
        };
        let svg = bars(&series);
        assert!(svg.contains("the most 0\""), "{svg}");
        assert!(!svg.contains("#5aa469"), "{svg}");
        assert!(svg.ends_with("stroke=\"#8a94a6\"/></svg>"), "{svg}");
    }
}
