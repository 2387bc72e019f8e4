//! The machine drawn as an SVG picture, at compile time, for its rustdoc: states as boxes in
//! columns (a state stands one column right of the furthest state that leads to it), the
//! transitions as arrows, initial states marked by an arrow from a dot, final states by a
//! double border. Self-contained (no script, no font or style fetched), drawn in
//! `currentColor` so it reads on light and dark themes.

use std::fmt::Write;

/// The drawing's measures, in pixels.
const MARGIN: usize = 16;
/// Room on the left for the initial states' dot and arrow.
const START: usize = 28;
const BOX_HEIGHT: usize = 32;
const ROW_GAP: usize = 18;
const COLUMN_GAP: usize = 56;
/// Monospace characters at 13 px are about 8 px wide.
const CHAR_WIDTH: usize = 8;
const PADDING: usize = 24;

/// The SVG of a machine with states `names` and transitions `edges` (indices into
/// `names`; the derive has checked that they form no cycle).
pub fn svg(machine: &str, names: &[&str], edges: &[(u16, u16)]) -> String {
    let columns = columns(names.len(), edges);
    let width = names.iter().map(|n| n.len()).max().unwrap_or(1) * CHAR_WIDTH + PADDING;
    let count = columns.iter().copied().max().map_or(0, |c| c + 1);
    let mut rows = vec![0usize; count];
    let mut row_of = vec![0usize; names.len()];
    for (state, &column) in columns.iter().enumerate() {
        row_of[state] = rows[column];
        rows[column] += 1;
    }
    let tallest = rows.iter().copied().max().unwrap_or(1);
    let column_height = |n: usize| n * BOX_HEIGHT + n.saturating_sub(1) * ROW_GAP;
    let total_width = MARGIN * 2 + START + count * width + count.saturating_sub(1) * COLUMN_GAP;
    let total_height = MARGIN * 2 + column_height(tallest);
    // The top left corner of each state's box; each column centred vertically.
    let corner = |state: usize| {
        let column = columns[state];
        let offset = (column_height(tallest) - column_height(rows[column])) / 2;
        (
            MARGIN + START + column * (width + COLUMN_GAP),
            MARGIN + offset + row_of[state] * (BOX_HEIGHT + ROW_GAP),
        )
    };
    let arrow = format!("idem-arrow-{machine}");
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{total_width}\" height=\"{total_height}\" \
         viewBox=\"0 0 {total_width} {total_height}\" role=\"img\" \
         aria-label=\"The state machine {machine}\" \
         font-family=\"monospace\" font-size=\"13\" fill=\"none\" stroke=\"currentColor\">\
         <title>The state machine {machine}</title>\
         <defs><marker id=\"{arrow}\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" \
         markerWidth=\"8\" markerHeight=\"8\" orient=\"auto-start-reverse\">\
         <path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"currentColor\" stroke=\"none\"/></marker></defs>"
    );
    for &(from, to) in edges {
        let (x1, y1) = corner(from as usize);
        let (x2, y2) = corner(to as usize);
        let (x1, y1, x2, y2) = (x1 + width, y1 + BOX_HEIGHT / 2, x2, y2 + BOX_HEIGHT / 2);
        let bend = COLUMN_GAP / 2;
        let _ = write!(
            out,
            "<path d=\"M {x1} {y1} C {} {y1}, {} {y2}, {x2} {y2}\" marker-end=\"url(#{arrow})\"/>",
            x1 + bend,
            x2 - bend
        );
    }
    for (state, name) in names.iter().enumerate() {
        let (x, y) = corner(state);
        let initial = !edges.iter().any(|&(_, to)| to as usize == state);
        let last = is_final(state, edges);
        if initial {
            let cy = y + BOX_HEIGHT / 2;
            let _ = write!(
                out,
                "<circle cx=\"{}\" cy=\"{cy}\" r=\"4\" fill=\"currentColor\"/>\
                 <path d=\"M {} {cy} L {x} {cy}\" marker-end=\"url(#{arrow})\"/>",
                x - START + 4,
                x - START + 8
            );
        }
        let _ = write!(
            out,
            "<rect x=\"{x}\" y=\"{y}\" width=\"{width}\" height=\"{BOX_HEIGHT}\" rx=\"6\"/>"
        );
        if last {
            let _ = write!(
                out,
                "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"4\"/>",
                x + 3,
                y + 3,
                width - 6,
                BOX_HEIGHT - 6
            );
        }
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" dominant-baseline=\"central\" \
             fill=\"currentColor\" stroke=\"none\">{name}</text>",
            x + width / 2,
            y + BOX_HEIGHT / 2
        );
    }
    out.push_str("</svg>");
    out
}

/// Whether no transition leaves `state`.
pub fn is_final(state: usize, edges: &[(u16, u16)]) -> bool {
    !edges.iter().any(|&(from, _)| from as usize == state)
}

/// Each state's column: 0 for a state no transition leads to, else one more than the
/// furthest of the states leading to it (the longest path, so every arrow points right).
fn columns(states: usize, edges: &[(u16, u16)]) -> Vec<usize> {
    let mut column = vec![0usize; states];
    // No cycles: after `states` rounds every longest path has been followed.
    for _ in 0..states {
        let mut moved = false;
        for &(from, to) in edges {
            let (from, to) = (from as usize, to as usize);
            if column[to] < column[from] + 1 {
                column[to] = column[from] + 1;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    column
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: [&str; 4] = ["CREATED", "PAID", "SHIPPED", "CANCELLED"];
    const EDGES: [(u16, u16); 3] = [(0, 1), (0, 3), (1, 2)];

    #[test]
    fn states_stand_right_of_every_state_leading_to_them() {
        assert_eq!(columns(4, &EDGES), [0, 1, 2, 1]);
        // A shortcut does not pull a state left of its longest path.
        assert_eq!(columns(3, &[(0, 2), (0, 1), (1, 2)]), [0, 1, 2]);
    }

    #[test]
    fn the_picture_has_every_state_and_transition() {
        let svg = svg("Order", &ORDER, &EDGES);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.ends_with("</svg>"));
        for name in ORDER {
            assert_eq!(svg.matches(&format!(">{name}</text>")).count(), 1, "{name}");
        }
        // Three transitions and one initial state: four arrows.
        assert_eq!(svg.matches("marker-end=").count(), 4);
        // SHIPPED and CANCELLED are final: a double border each.
        assert_eq!(svg.matches("<rect").count(), 4 + 2);
        // An HTML block in Markdown ends at a blank line: the picture has none.
        assert!(!svg.contains('\n'));
        assert!(!svg.contains("<script"));
    }
}
