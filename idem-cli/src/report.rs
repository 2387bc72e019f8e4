//! What a command prints, and how it ends: a table or a line for people, JSON with
//! `--json`; an exit code scripts can rely on.

use std::process::ExitCode;

/// Why a command failed, and its exit code.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The database failed or refused (exit 1).
    Database(String),
    /// A bad argument or URL (exit 2, as clap's own usage errors).
    Usage(String),
    /// A message named does not exist, or is not in the state the command needs (exit 3).
    NotFound(String),
}

impl Failure {
    pub(crate) fn database(error: impl std::fmt::Display) -> Failure {
        Failure::Database(error.to_string())
    }

    /// Prints the failure (to stderr; as JSON on stdout with `--json`) and its exit code.
    pub(crate) fn exit(self, json: bool) -> ExitCode {
        let (code, kind, message) = match self {
            Failure::Database(message) => (1, "database", message),
            Failure::Usage(message) => (2, "usage", message),
            Failure::NotFound(message) => (3, "not_found", message),
        };
        if json {
            println!(
                "{}",
                serde_json::json!({"error": {"kind": kind, "message": message}})
            );
        }
        eprintln!("idem: {message}");
        ExitCode::from(code)
    }
}

/// Prints what a command did: `line` for people, `value` with `--json`.
pub(crate) fn done(json: bool, line: &str, value: serde_json::Value) {
    if json {
        println!("{value}");
    } else {
        println!("{line}");
    }
}

/// A table for people: a header, then rows, columns padded to their widest cell.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push('\n');
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_pads_each_column_to_its_widest_cell() {
        let rows = vec![
            vec!["3".to_owned(), "connection refused".to_owned()],
            vec!["12".to_owned(), "timeout".to_owned()],
        ];
        assert_eq!(
            table(&["count", "error"], &rows),
            "count  error\n3      connection refused\n12     timeout"
        );
    }
}
