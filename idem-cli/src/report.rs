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
    /// `idem check` or `idem reconcile` found something to fix, and printed it (exit 4).
    Unhealthy,
}

impl Failure {
    pub(crate) fn database(error: impl std::fmt::Display) -> Failure {
        Failure::Database(error.to_string())
    }

    /// Prints the failure (to stderr; as JSON on stdout with `--json`) and its exit code.
    pub(crate) fn exit(self, json: bool) -> ExitCode {
        let (code, kind, message) = match self {
            // Its report is out already.
            Failure::Unhealthy => return ExitCode::from(4),
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

/// `--yes`, which every command that changes or deletes something takes: without it, the
/// command says what it would do and changes nothing (a dry run, exit 0).
#[derive(clap::Args, Debug, Clone, Copy)]
pub(crate) struct Confirm {
    /// Do it. Without it, the command says what it would do and changes nothing.
    #[arg(long)]
    pub(crate) yes: bool,
}

/// Prints what a command did: `line` for people, `value` with `--json`.
pub(crate) fn done(json: bool, line: &str, value: serde_json::Value) {
    if json {
        println!("{value}");
    } else {
        println!("{line}");
    }
}

/// Logs an action on the standard error, for the shell's history and the terminal's log:
/// when (UTC, by this machine's clock), who, and what.
pub(crate) fn audit(actor: &str, what: &str) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    eprintln!("idem: {} {actor} {what}", utc(now));
}

/// Milliseconds since the Unix epoch as an RFC 3339 time in UTC, to the second.
pub(crate) fn utc(millis: i64) -> String {
    let seconds = millis.div_euclid(1000);
    let (days, of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// A duration as people write it: a number and a unit, `ms`, `s`, `m`, `h` or `d`
/// (`30d`, `12h`, `500ms`).
pub(crate) fn duration(text: &str) -> Result<std::time::Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` has no unit: write 30d, 12h, 15m, 30s or 500ms"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` does not start with a whole number"))?;
    let millis = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("unknown unit `{unit}`: use ms, s, m, h or d")),
    };
    n.checked_mul(millis)
        .map(std::time::Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is too long"))
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
    use std::time::Duration;

    #[test]
    fn times_are_written_in_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_644_799_999), "2026-12-07T11:59:59Z");
        assert_eq!(utc(-1000), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn durations_are_read_with_their_unit() {
        assert_eq!(duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(duration("12h"), Ok(Duration::from_secs(12 * 3600)));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("0s"), Ok(Duration::ZERO));
        assert!(duration("30").unwrap_err().contains("no unit"));
        assert!(duration("3w").unwrap_err().contains("unknown unit `w`"));
        assert!(duration("d").is_err());
        assert!(duration("99999999999999999999d").is_err());
    }

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
