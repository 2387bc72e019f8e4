//! `idem check`: which of this version's migrations the database has, and what is wrong
//! with idem's tables (the part of `idem::verify` that needs no machine).

use crate::database::{Database, with_pool};
use crate::report::{self, Failure};

pub(crate) async fn run(
    database: &Database,
    results_table: Option<&str>,
    json: bool,
) -> Result<(), Failure> {
    let report = with_pool!(database, pool => idem::check_tables(pool, results_table).await)
        .map_err(Failure::database)?;
    let rows: Vec<Vec<String>> = report
        .migrations
        .iter()
        .map(|m| {
            vec![
                m.name.to_owned(),
                if m.applied { "applied" } else { "not applied" }.to_owned(),
            ]
        })
        .collect();
    let mut text = format!(
        "{}\n\n{}",
        report::table(&["migration", "state"], &rows),
        match report.current() {
            Some(current) => format!("on migration {current}"),
            None => "not migrated".to_owned(),
        }
    );
    for problem in &report.problems {
        text.push_str(&format!("\nproblem: {problem}"));
    }
    if report.pending().next().is_some() {
        text.push_str("\nrun `idem migrate` to apply what is missing");
    }
    report::done(
        json,
        &text,
        serde_json::json!({
            "ok": report.is_ok(),
            "current": report.current(),
            "migrations": report.migrations.iter().map(|m| serde_json::json!({
                "name": m.name,
                "applied": m.applied,
            })).collect::<Vec<_>>(),
            "problems": report.problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
        }),
    );
    if report.is_ok() {
        Ok(())
    } else {
        Err(Failure::Unhealthy)
    }
}
